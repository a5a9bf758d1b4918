"""The direct data path of http kv-gets: the gateway grants a ticket, the storage server's data endpoint streams.

Real processes: ``objectcache serve`` with ``storage_server.data_listen`` set. The
ticket is a capability only that storage server can mint: tampered, expired,
reused, or presented with another descriptor, it is refused; a tenant gets no
ticket for another tenant's bucket; nothing but a ticketed kv-get is served there.
"""

from __future__ import annotations

import json
import socket
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from rawhttp import signed
from support import ServerProcess, boto_client, write_config

from client_sdk import ObjectCacheError
from protocol.data_ticket import GRANT_CONTENT_TYPE, HEADER_DIRECT
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

LAYOUT = tiny_layout(16, num_layers=4)
TTL_S = 3.0
N = 24


@pytest.fixture(scope="module")
def direct_node(tmp_path_factory, tenants):
    """A node with a data endpoint on a free port, and alice's bucket of N chunks."""
    root = tmp_path_factory.mktemp("direct")
    config = write_config(root / "c.toml", root / "data", [tenants["alice"], tenants["bob"]],
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\ndata_listen = "127.0.0.1:0"\ndata_ticket_ttl_s = {TTL_S}\n')
    proc = ServerProcess(config).start()
    boto_client(proc.endpoint, tenants["alice"]).create_bucket(Bucket="direct")
    boto_client(proc.endpoint, tenants["bob"]).create_bucket(Bucket="direct-bob")
    keys, chunks = keys_for(LAYOUT, N, "direct"), make_chunks(LAYOUT, N, seed=7)

    async def put():
        async with client(proc, tenants["alice"], "direct") as c:
            await c.put_chunks(keys, chunks, LAYOUT)

    run(put())
    yield proc, keys, chunks
    proc.stop()


def descriptor(keys) -> bytes:
    target = Target(TransportKind.HTTP, length=len(keys) * LAYOUT.chunk_bytes)
    return encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, target))


def grant(node, tenant, bucket: str, body: bytes) -> dict:
    r = signed(node.endpoint, tenant, "POST", f"/{bucket}?kv-get", headers={HEADER_DIRECT: "1"}, body=body)
    assert r.status == 200 and r.headers["Content-Type"].startswith(GRANT_CONTENT_TYPE), r.body
    return json.loads(r.body)


def data_get(endpoint: str, ticket: str, body: bytes, op: str = "kv-get", **fields) -> tuple[dict, bytes]:
    """One request on the data endpoint: its reply line and whatever followed until the server closed."""
    host, _, port = endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(json.dumps({"op": op, "body": len(body), "ticket": ticket, **fields}).encode() + b"\n" + body)
        f = s.makefile("rb")
        return json.loads(f.readline()), f.read()


def fetch(node, tenant, keys, direct: bool):
    async def go():
        async with client(node, tenant, "direct") as c:
            c.direct = direct
            return await c.fetch(keys, LAYOUT, "http")

    return run(go())


def test_direct_fetch_delivers_the_same_bytes_and_stats_as_the_relay(direct_node, tenants):
    node, keys, chunks = direct_node
    direct, d_stats = fetch(node, tenants["alice"], keys, direct=True)
    relayed, r_stats = fetch(node, tenants["alice"], keys, direct=False)
    assert d_stats.direct and not r_stats.direct
    expected = reference(LAYOUT, chunks)
    assert np.array_equal(direct.reshape(-1), expected.reshape(-1)) and np.array_equal(relayed.reshape(-1), expected.reshape(-1))
    for s in (d_stats, r_stats):  # END statistics arrive either way
        assert s.server.payload_bytes == N * LAYOUT.chunk_bytes and s.server.mode and s.server.total_s > 0 and s.request_id
    assert d_stats.server.request_id == d_stats.request_id  # the storage server logs the gateway's request id


def test_direct_errors_are_the_relays_errors(direct_node, tenants):
    node, keys, _ = direct_node
    missing = keys[:3] + ["direct/never-stored"]
    seen = []
    for direct in (True, False):
        with pytest.raises(ObjectCacheError) as e:
            fetch(node, tenants["alice"], missing, direct)
        seen.append((e.value.code, e.value.message, e.value.resource, e.value.extra))
    assert seen[0] == seen[1], seen
    assert seen[0][0].name == "NoSuchKey" and seen[0][3]["Key"] == "direct/never-stored"


def test_a_node_without_data_endpoint_relays(server, tenants):
    from kvsupport import put_and_fetch

    payload, stats = put_and_fetch(server, tenants["alice"], "direct-fallback", 4, transport="http")
    assert not stats.direct and payload.size == 4 * tiny_layout(16).chunk_bytes


def test_ticket_is_good_once_and_for_its_descriptor_only(direct_node, tenants):
    node, keys, _ = direct_node
    body = descriptor(keys[:4])
    g = grant(node, tenants["alice"], "direct", body)
    other, _ = data_get(g["endpoint"], g["ticket"], descriptor(keys[:5]))
    assert not other["ok"] and other["error"]["code"] == "AccessDenied" and "another descriptor" in other["error"]["message"]
    first, frames = data_get(g["endpoint"], g["ticket"], body)
    assert first.get("ok"), first
    assert first["payload_bytes"] == 4 * LAYOUT.chunk_bytes and len(frames) > first["payload_bytes"]
    again, _ = data_get(g["endpoint"], g["ticket"], body)
    assert not again["ok"] and again["error"]["code"] == "AccessDenied" and "already used" in again["error"]["message"]


def test_tampered_ticket_is_refused(direct_node, tenants):
    node, keys, _ = direct_node
    body = descriptor(keys[:2])
    g = grant(node, tenants["alice"], "direct", body)
    payload, _, mac = g["ticket"].partition(".")
    import base64

    fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    fields["tenant"], fields["bucket"] = "bob", "direct-bob"  # claim someone else's identity, keep the signature
    forged = base64.urlsafe_b64encode(json.dumps(fields).encode()).rstrip(b"=").decode() + "." + mac
    for ticket in (forged, g["ticket"][:-2] + ("AA" if not g["ticket"].endswith("AA") else "BB"), "not-a-ticket", ""):
        reply, rest = data_get(g["endpoint"], ticket, body)
        assert not reply["ok"] and reply["error"]["code"] == "AccessDenied" and rest == b"", ticket


def test_expired_ticket_is_refused(direct_node, tenants):
    node, keys, _ = direct_node
    body = descriptor(keys[:2])
    g = grant(node, tenants["alice"], "direct", body)
    assert 0 < g["expires_in_s"] <= TTL_S
    time.sleep(TTL_S + 0.3)
    reply, _ = data_get(g["endpoint"], g["ticket"], body)
    assert not reply["ok"] and reply["error"]["code"] == "AccessDenied" and "expired" in reply["error"]["message"]


def test_no_ticket_for_another_tenants_bucket(direct_node, tenants):
    node, keys, _ = direct_node
    r = signed(node.endpoint, tenants["bob"], "POST", "/direct?kv-get", headers={HEADER_DIRECT: "1"}, body=descriptor(keys[:2]))
    assert r.status == 403 and ET.fromstring(r.body).findtext("Code") == "AccessDenied"


def test_data_endpoint_serves_nothing_but_ticketed_kv_gets(direct_node, tenants):
    node, keys, _ = direct_node
    g = grant(node, tenants["alice"], "direct", descriptor(keys[:2]))
    # The trusted RPC's operations, with the fields the gateway would vouch for, are refused here.
    for op, fields in (("kv-lookup", {"bucket": "direct"}), ("status", {}), ("kv-ticket", {"tenant": "alice", "bucket": "direct"})):
        reply, _ = data_get(g["endpoint"], "", b"", op=op, **fields)
        assert not reply["ok"] and reply["error"]["code"] == "InvalidRequest" and "not served" in reply["error"]["message"], op
    # A kv-get naming a tenant and bucket instead of a ticket is no kv-get at all.
    host, _, port = g["endpoint"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        body = descriptor(keys[:2])
        s.sendall(json.dumps({"op": "kv-get", "body": len(body), "tenant": "alice", "bucket": "direct"}).encode() + b"\n" + body)
        reply = json.loads(s.makefile("rb").readline())
    assert not reply["ok"] and reply["error"]["code"] == "InvalidRequest" and "ticket" in reply["error"]["message"]


def test_the_sdks_own_memory_is_reused_by_the_next_fetch_and_never_shared_by_two_at_once(direct_node, tenants):
    """Without ``out``, a fetch lends memory of the SDK's own: back to the pool when its block exits, like a shm region."""
    node, keys, chunks = direct_node
    expected = reference(LAYOUT, chunks).reshape(-1)

    def address(layers) -> int:
        return np.frombuffer(layers.payload, np.uint8).ctypes.data

    async def go():
        async with client(node, tenants["alice"], "direct") as c:
            async with c.fetch_layers(keys, LAYOUT, "http") as first, c.fetch_layers(keys, LAYOUT, "http") as second:
                async for _ in first:
                    pass
                async for _ in second:
                    pass
                together = (address(first), address(second))
                assert bytes(first.payload) == bytes(second.payload) == expected.tobytes()
            async with c.fetch_layers(keys[: N // 2], LAYOUT, "http") as later:  # smaller: fits either buffer
                async for _ in later:
                    pass
                assert bytes(later.payload) == reference(LAYOUT, chunks[: N // 2]).tobytes()
                return together, address(later)

    (a, b), later = run(go())
    assert a != b and later in (a, b)
