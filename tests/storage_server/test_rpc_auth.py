"""The TCP RPC listener admits only holders of the shared key (security audit round two, item 2).

Before: anyone who reached ``storage_server.tcp`` could send ``{"op": "kv-lookup", "tenant": …}`` or
``status`` and be answered. Now every TCP connection starts with an HMAC challenge-response on
``storage_server.rpc_key_file``; a non-loopback listener without a key refuses to start.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from support import REPO, ServerProcess, boto_client, free_port, make_tenants, write_config

from protocol.config import ConfigError, load_config
from protocol.errors import ErrorCode, S3Error
from protocol.rpc_auth import STORAGE_RPC_PURPOSE, SharedKey, check_proof, proof


def key_file(path, key: str) -> str:
    path.write_text(key + "\n")
    path.chmod(0o600)
    return str(path)


def raw_exchange(port: int, *lines: bytes) -> list[dict]:
    """Lines to the TCP listener; every JSON line it sends back until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for line in lines:
            s.sendall(line)
        s.shutdown(socket.SHUT_WR)
        return [json.loads(line) for line in s.makefile("rb") if line.strip()]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A storage server on TCP with a key, and a gateway holding the same key (separate processes)."""
    root = tmp_path_factory.mktemp("keyed")
    tenant = make_tenants("alice")[0]
    port = free_port()
    key = secrets.token_urlsafe(32)
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[storage_server]\ntcp = "127.0.0.1:{port}"\nrpc_key_file = "{key_file(root / "rpc.key", key)}"\n'))
    storage = ServerProcess(config, command="storage-server").start()
    gateway = ServerProcess(config, command="gateway").start()
    yield storage, gateway, tenant, port, key, root
    gateway.stop()
    storage.stop()


def test_the_gateway_with_the_key_serves_kv_over_tcp(keyed):
    _, gateway, tenant, _, _, _ = keyed
    boto_client(gateway.endpoint, tenant).create_bucket(Bucket="secret")
    layout = tiny_layout(16)
    keys, chunks = keys_for(layout, 8, "k"), make_chunks(layout, 8, seed=1)

    async def scenario():
        async with client(gateway, tenant, "secret") as c:
            await c.put_chunks(keys, chunks, layout)
            payload, _ = await c.fetch(keys, layout, "http")
            assert np.array_equal(payload, reference(layout, chunks))
            assert await c.lookup(keys) == len(keys)

    run(scenario())


def test_a_stranger_without_the_key_is_answered_nothing_but_a_refusal(keyed):
    _, _, _, port, _, _ = keyed
    for op in (b'{"op": "status"}\n', b'{"op": "kv-lookup", "tenant": "alice", "bucket": "secret", "body": 0}\n',
               b'{"op": "ping"}\n'):
        replies = raw_exchange(port, op)
        assert replies[0]["auth"] == "hmac-sha256-v1" and "challenge" in replies[0]  # the challenge, then
        assert len(replies) == 2 and replies[1]["ok"] is False and replies[1]["error"]["code"] == "AccessDenied", replies


def test_a_wrong_key_and_a_replayed_proof_are_refused(keyed):
    _, _, _, port, key, _ = keyed
    wrong = SharedKey(b"not-the-key-" * 3, STORAGE_RPC_PURPOSE)
    right = SharedKey(key.encode(), STORAGE_RPC_PURPOSE)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        f = s.makefile("rb")
        challenge = bytes.fromhex(json.loads(f.readline())["challenge"])
        mine = secrets.token_bytes(32)
        s.sendall(json.dumps({"auth": "hmac-sha256-v1", "challenge": mine.hex(),
                              "proof": proof(wrong, "client", challenge, mine).hex()}).encode() + b"\n")
        replies = [json.loads(line) for line in f]
    assert [r.get("ok") for r in replies] == [False] and replies[0]["error"]["code"] == "AccessDenied"

    # A proof made with the right key for one connection's challenge is worthless on the next.
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        f = s.makefile("rb")
        first = bytes.fromhex(json.loads(f.readline())["challenge"])
        mine = secrets.token_bytes(32)
        stolen = {"auth": "hmac-sha256-v1", "challenge": mine.hex(), "proof": proof(right, "client", first, mine).hex()}
        s.sendall(json.dumps(stolen).encode() + b"\n")
        reply = json.loads(f.readline())
        assert reply["ok"] is True and check_proof(right, "server", first, mine, bytes.fromhex(reply["proof"]))
    replies = raw_exchange(port, json.dumps(stolen).encode() + b"\n")
    assert replies[1]["ok"] is False and replies[1]["error"]["code"] == "AccessDenied" and len(replies) == 2


def test_a_gateway_with_another_key_gets_503_for_kv_while_plain_s3_works(keyed, tmp_path):
    _, _, tenant, port, _, root = keyed
    config = write_config(tmp_path / "c.toml", root / "data", [tenant], extra=(
        f'\n[storage_server]\ntcp = "127.0.0.1:{port}"\nrpc_key_file = "{key_file(tmp_path / "other.key", secrets.token_urlsafe(32))}"\n'))
    gateway = ServerProcess(config, command="gateway").start()
    try:
        s3 = boto_client(gateway.endpoint, tenant)
        s3.create_bucket(Bucket="other-gw")
        s3.put_object(Bucket="other-gw", Key="plain", Body=b"still served")
        assert s3.get_object(Bucket="other-gw", Key="plain")["Body"].read() == b"still served"
        layout = tiny_layout(16)

        async def scenario():
            async with client(gateway, tenant, "other-gw") as c:
                with pytest.raises(S3Error) as e:
                    await c.lookup(keys_for(layout, 2, "x"))
                assert e.value.code == ErrorCode.ServiceUnavailable and "RPC key" in e.value.message

        run(scenario())
    finally:
        gateway.stop()


def test_a_listener_beyond_loopback_needs_a_key(tmp_path):
    with pytest.raises(ConfigError, match="rpc_key_file"):
        load_config(env={"OBJECTCACHE_STORAGE_SERVER_TCP": "0.0.0.0:9400"})
    with pytest.raises(ConfigError, match="at least 16"):
        load_config(env={"OBJECTCACHE_STORAGE_SERVER_TCP": "0.0.0.0:9400", "OBJECTCACHE_STORAGE_SERVER_RPC_KEY": "short"})
    assert load_config(env={"OBJECTCACHE_STORAGE_SERVER_TCP": "0.0.0.0:9400",
                            "OBJECTCACHE_STORAGE_SERVER_RPC_KEY": secrets.token_urlsafe(24)}).storage_server.rpc_key
    # The daemon itself refuses to start that way (exit 2, the key named), and a key file it cannot read too.
    tenant = make_tenants("t")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\ntcp = "0.0.0.0:{free_port()}"\n')
    done = subprocess.run([sys.executable, "-m", "objectcache", "storage-server", "--config", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "rpc_key_file" in done.stderr, done.stderr
    config.write_text(config.read_text() + f'rpc_key_file = "{tmp_path / "missing.key"}"\n')
    done = subprocess.run([sys.executable, "-m", "objectcache", "storage-server", "--config", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "missing.key" in done.stderr, done.stderr


def test_a_key_for_another_purpose_is_refused_both_ways():
    """A cluster key and the RPC key never stand in for each other, even with the same secret."""
    import asyncio

    from protocol.rpc_auth import client_handshake, server_handshake

    secret = secrets.token_bytes(32)
    rpc_key, cluster_key = SharedKey(secret, STORAGE_RPC_PURPOSE), SharedKey(secret, "cluster")
    assert proof(rpc_key, "client", b"s", b"c") != proof(cluster_key, "client", b"s", b"c")

    async def attempt(server_key: SharedKey, client_key: SharedKey) -> tuple[object, object]:
        results: list[object] = []

        async def serve(reader, writer):
            try:
                await server_handshake(reader, writer, server_key)
                results.append("admitted")
            except S3Error as e:
                results.append(e)
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await asyncio.wait_for(client_handshake(reader, writer, client_key), 10)
            mine: object = "authenticated"
        except S3Error as e:
            mine = e
        writer.close()
        server.close()
        await server.wait_closed()
        return mine, results[0] if results else None

    mine, theirs = asyncio.run(attempt(rpc_key, rpc_key))
    assert (mine, theirs) == ("authenticated", "admitted")
    mine, _ = asyncio.run(attempt(rpc_key, cluster_key))
    assert isinstance(mine, S3Error) and mine.code == ErrorCode.AccessDenied and "cluster" in mine.message
