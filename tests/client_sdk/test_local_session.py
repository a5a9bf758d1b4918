"""The local fast path end to end: one signed registration, kv-gets on the session socket, every check kept."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

import numpy as np
import pytest
from kvsupport import keys_for, make_chunks, reference, rpc, run, tiny_layout

from client_sdk import ObjectCacheClient, ObjectCacheError
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import Op, RpcRequest, decode_reply, encode_error
from protocol.wire import Descriptor, Mode, TransportKind, encode_descriptor


def local_client(server, tenant, bucket: str) -> ObjectCacheClient:
    return ObjectCacheClient(server.endpoint, tenant.access_key, tenant.secret_key, bucket=bucket, local_session=True)


@pytest.fixture(scope="module")
def stored(server, tenants, s3):
    bucket = "local-session"
    s3.create_bucket(Bucket=bucket)
    layout = tiny_layout(16)
    keys = keys_for(layout, 40, "local-session")
    chunks = make_chunks(layout, 40, seed=21)

    async def put():
        async with local_client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, chunks, layout)

    run(put())
    return bucket, layout, keys, chunks


def test_fetches_go_to_the_session_socket_and_deliver_every_layer(server, tenants, stored):
    bucket, layout, keys, chunks = stored

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as c:
            seen = []
            async with c.fetch_layers(keys, layout, "shm", mode="layerwise") as layers:
                async for idx, _ in layers:
                    seen.append(idx)
            payload, stats = await c.fetch(keys, layout, "shm")
            assert seen == list(range(layout.num_layers))
            assert np.array_equal(payload, reference(layout, chunks))
            # Served on the session socket: no gateway request id, the session's own.
            assert stats.direct and stats.gateway_s == 0 and stats.server.request_id.startswith("L")
        assert rpc(server.rpc_socket, "status")["local_sessions"]["sessions"] >= 1

    run(scenario())


def _session_kv_get(grant, socket_path: str, descriptor: bytes) -> dict:
    """The same capability sent from another process: its reply line."""
    line = RpcRequest(Op.KV_GET, {"session": grant.session, "secret": grant.secret}, len(descriptor)).encode()
    code = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "s.sendall(bytes.fromhex(sys.argv[2])); print(s.makefile('rb').readline().decode())")
    out = subprocess.run([sys.executable, "-c", code, socket_path, (line + descriptor).hex()], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_the_capability_is_bound_to_the_registering_process(server, tenants, stored):
    bucket, layout, keys, _ = stored

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as c:
            await c.fetch(keys[:2], layout, "shm")
            grant, path = c._local._grant, c._local._socket
            shm = c._destinations[TransportKind.SHM]
            dest = await shm.acquire(layout.payload_bytes(2), None)
            try:
                d = Descriptor(keys[:2], layout.num_layers, layout.chunk_tokens, layout.per_layer_chunk_bytes, dest.target,
                               mode=Mode.LAYERWISE)
                reply = _session_kv_get(grant, path, encode_descriptor(d))
            finally:
                shm.release(dest)
            assert reply["error"]["code"] == "AccessDenied" and "another process" in reply["error"]["message"]

    run(scenario())


def test_a_session_reads_only_its_tenants_bucket_and_writes_only_its_tenants_regions(server, tenants, stored, s3_bob):
    bucket, layout, keys, _ = stored
    s3_bob.create_bucket(Bucket="local-session-bob")

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as alice, \
                local_client(server, tenants["bob"], bucket) as bob_on_alices, \
                local_client(server, tenants["bob"], "local-session-bob") as bob:
            with pytest.raises(ObjectCacheError) as e:  # no session for another tenant's bucket
                await bob_on_alices.fetch(keys, layout, "shm")
            assert e.value.code.name == "AccessDenied"
            with pytest.raises(ObjectCacheError) as e:  # bob's session is for bob's bucket: alice's keys are not there
                await bob.fetch(keys, layout, "shm")
            assert e.value.code.name == "NoSuchKey"
            # Bob's own session naming alice's shm region: the region capability is checked as on the gateway path.
            shm = alice._destinations[TransportKind.SHM]
            dest = await shm.acquire(layout.payload_bytes(2), None)
            try:
                d = Descriptor(keys[:2], layout.num_layers, layout.chunk_tokens, layout.per_layer_chunk_bytes, dest.target,
                               mode=Mode.LAYERWISE)
                with pytest.raises(ObjectCacheError) as e:
                    await bob._local.open(d)
                assert e.value.code.name == "AccessDenied" and "region" in e.value.message
            finally:
                shm.release(dest)

    run(scenario())


def test_a_session_ends_with_its_bucket(server, tenants, s3, s3_bob):
    s3.create_bucket(Bucket="local-session-gone")
    layout = tiny_layout(16)
    keys = keys_for(layout, 4, "local-session-gone")

    async def scenario():
        async with local_client(server, tenants["alice"], "local-session-gone") as c:
            await c.put_chunks(keys, make_chunks(layout, 4, seed=3), layout)
            await c.fetch(keys, layout, "shm")
            assert c._local._grant is not None
            for k in keys:
                s3.delete_object(Bucket="local-session-gone", Key=k)
            s3.delete_bucket(Bucket="local-session-gone")
            s3_bob.create_bucket(Bucket="local-session-gone")  # the same name, now bob's: alice's session must not reach it
            with pytest.raises(ObjectCacheError) as e:
                await c.fetch(keys, layout, "shm")
            # Refused on the socket (the bucket is another incarnation), then the fresh registration by the gateway.
            assert e.value.code.name == "AccessDenied" and c._local._grant is None

    run(scenario())


def test_kv_gets_reuse_the_session_connection_and_a_closed_one_is_replaced(server, tenants, stored):
    """A kv-get that ended (its END frame) leaves its connection for the next one; one refused with an error line closes
    it; a kept connection that reads as closed is dropped and a new one made, with the kv-get unharmed."""
    bucket, layout, keys, chunks = stored
    want = reference(layout, chunks)
    status = lambda: rpc(server.rpc_socket, "status")["local_sessions"]  # noqa: E731

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as c:
            await c.fetch(keys, layout, "shm")  # the session registered, one connection kept
            before = status()
            for _ in range(5):
                payload, _ = await c.fetch(keys, layout, "shm")
                assert np.array_equal(payload, want)
            regions = rpc(server.rpc_socket, "status")["regions"]
            with pytest.raises(ObjectCacheError) as e:  # refused before any byte moved: that connection is closed
                await c.fetch([*keys[:3], "local-session/not-stored"], layout, "shm")
            assert e.value.code.name == "NoSuchKey"
            # Refused, the kv-get wrote nothing: its region goes back to the pool, not retired (the next fetch uses it).
            assert rpc(server.rpc_socket, "status")["regions"] == regions
            payload, _ = await c.fetch(keys, layout, "shm")
            assert np.array_equal(payload, want)
            after = status()
            assert after["kv_gets"] - before["kv_gets"] == 7
            assert after["connections"] - before["connections"] == 1, (before, after)  # only after the refusal
            for sock in c._local._idle:  # kept connections that read as closed (as one the server let go of when idle)
                sock.shutdown(2)
            payload, _ = await c.fetch(keys, layout, "shm")
            assert np.array_equal(payload, want)
            assert status()["connections"] - after["connections"] == 1
            assert rpc(server.rpc_socket, "status")["regions"] == regions

    run(scenario())


@pytest.mark.parametrize("answer", ["closed unread", "RequestTimeout"])
def test_a_kept_connection_the_node_lets_go_of_as_the_request_is_sent_is_retried_once_on_a_new_one(server, tenants, stored, answer):
    """The race a peek cannot see: the kept connection reads as open, and the node closes it (idle past its request
    timeout) as the next kv-get is sent: closed with the request unread, or with its RequestTimeout line. That kv-get
    never ran, so the SDK sends it once more on a new connection, and it delivers every layer. Scripted here by
    swapping the kept connection for a socket pair's end."""
    bucket, layout, keys, chunks = stored
    want = reference(layout, chunks)
    status = lambda: rpc(server.rpc_socket, "status")["local_sessions"]  # noqa: E731

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as c:
            await c.fetch(keys, layout, "shm")  # registered, one connection kept
            c._local.close_idle()
            ours, theirs = socket.socketpair()
            ours.setblocking(False)
            c._local._idle.append(ours)
            got = bytearray()

            def node_lets_go() -> None:  # what the node's side of that connection does
                theirs.settimeout(30)
                while b"\n" not in got:
                    got.extend(theirs.recv(65536))
                if answer == "RequestTimeout":
                    theirs.sendall(encode_error(S3Error(ErrorCode.RequestTimeout, "idle past the request timeout")))
                theirs.close()

            before = status()
            node = asyncio.get_running_loop().run_in_executor(None, node_lets_go)
            payload, _ = await c.fetch(keys, layout, "shm")
            await node
            assert np.array_equal(payload, want)
            assert json.loads(bytes(got).split(b"\n", 1)[0])["op"] == Op.KV_GET.value  # the kv-get went to the let-go connection
            after = status()
            assert after["kv_gets"] - before["kv_gets"] == 1  # only the retry reached the node
            assert after["connections"] - before["connections"] == 1  # on a new connection

    run(scenario())


def _resolved(server) -> int:
    return rpc(server.rpc_socket, "status")["local_sessions"]["key_lists"]["resolved"]


def test_a_prefix_fetched_again_sends_its_keys_by_reference(server, tenants, stored):
    bucket, layout, keys, chunks = stored

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as c:
            before = _resolved(server)
            first, _ = await c.fetch(keys, layout, "shm")
            assert _resolved(server) == before  # named: the keys went with their reference
            again, _ = await c.fetch(list(keys), layout, "shm")  # equal keys in another list
            assert _resolved(server) == before + 1
            other, _ = await c.fetch(keys[:7], layout, "shm")  # another list: named afresh
            assert _resolved(server) == before + 1
            for got, n in ((first, 40), (again, 40), (other, 7)):
                assert np.array_equal(got, reference(layout, chunks[:n]))

    run(scenario())


def test_a_reference_the_node_does_not_hold_is_answered_by_sending_the_keys(server, tenants, stored):
    bucket, layout, keys, chunks = stored

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as c:
            await c.fetch(keys[:3], layout, "shm")  # the session exists
            # This process believes it named the keys under a reference the node never saw (as after a node restart
            # that kept the session, or a name the node let go of).
            c._local._names.refs.remember(keys, b"\x07" * 16)
            before = _resolved(server)
            got, _ = await c.fetch(keys, layout, "shm")
            assert np.array_equal(got, reference(layout, chunks))
            assert c._local._names.refs.find(keys) != b"\x07" * 16  # the reference was refused and the keys named afresh
            again, _ = await c.fetch(keys, layout, "shm")  # named afresh by the retry: by reference from now on
            assert np.array_equal(again, reference(layout, chunks)) and _resolved(server) == before + 1

    run(scenario())


async def _raw_kv_get(local, body: bytes) -> None:
    """``body`` sent as it is on ``local``'s session; raises the node's error."""
    grant = await local._current()
    request = RpcRequest(Op.KV_GET, {"session": grant.session, "secret": grant.secret}, len(body))
    stream = await local._request(local._socket, request, body)
    try:
        decode_reply(await stream._read_line())
    finally:
        stream.close()


def test_a_reference_names_nothing_on_another_session(server, tenants, stored, s3_bob):
    bucket, layout, keys, _ = stored
    s3_bob.create_bucket(Bucket="local-session-refs-bob")

    async def scenario():
        async with local_client(server, tenants["alice"], bucket) as alice, \
                local_client(server, tenants["alice"], bucket) as alice_again, \
                local_client(server, tenants["bob"], "local-session-refs-bob") as bob:
            await alice.fetch(keys, layout, "shm")
            ref = alice._local._names.refs.find(keys)
            shm = alice._destinations[TransportKind.SHM]
            dest = await shm.acquire(layout.payload_bytes(len(keys)), None)
            try:
                body = encode_descriptor(Descriptor(keys, layout.num_layers, layout.chunk_tokens, layout.per_layer_chunk_bytes,
                                                    dest.target, mode=Mode.LAYERWISE, key_ref=ref, keys_by_ref=True))
                for other in (alice_again, bob):  # the same tenant's other session, and another tenant's
                    with pytest.raises(ObjectCacheError) as e:
                        await _raw_kv_get(other._local, body)
                    assert e.value.code.name == "KVUnknownKeyList"
            finally:
                shm.release(dest)

    run(scenario())
