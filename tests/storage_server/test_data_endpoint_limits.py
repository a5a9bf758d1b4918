"""The data endpoint checks a ticket before it reads a body, caps its connections and times them out
(security audit round two, item 5: 16 unauthenticated sockets × 63 MiB bodies grew the storage server by
1 GB, and 1,100 idle sockets took its file descriptors)."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from rawhttp import signed
from support import ServerProcess, boto_client, make_tenants, write_config

from protocol.data_ticket import HEADER_DIRECT
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

LAYOUT = tiny_layout(16, num_layers=2)
BIG = 63 << 20


def node(root, extra: str = ""):
    tenant = make_tenants("alice")[0]
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\ndata_listen = "127.0.0.1:0"\n{extra}'))
    proc = ServerProcess(config).start()
    boto_client(proc.endpoint, tenant).create_bucket(Bucket="data")
    keys, chunks = keys_for(LAYOUT, 4, "d"), make_chunks(LAYOUT, 4, seed=3)

    async def put():
        async with client(proc, tenant, "data") as c:
            await c.put_chunks(keys, chunks, LAYOUT)

    run(put())
    return proc, tenant, keys, chunks


def descriptor(keys) -> bytes:
    target = Target(TransportKind.HTTP, length=len(keys) * LAYOUT.chunk_bytes)
    return encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, target))


def grant(proc, tenant, body: bytes) -> dict:
    r = signed(proc.endpoint, tenant, "POST", "/data?kv-get", headers={HEADER_DIRECT: "1"}, body=body)
    assert r.status == 200, r.body
    return json.loads(r.body)


def connect(endpoint: str) -> socket.socket:
    host, _, port = endpoint.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=30)


def reply_without_body(endpoint: str, ticket: str, announced: int) -> dict:
    """Announce a body of ``announced`` bytes, send none of it, and read the answer."""
    with connect(endpoint) as s:
        s.sendall(json.dumps({"op": "kv-get", "body": announced, "ticket": ticket}).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def test_a_ticket_is_checked_before_the_body_is_read(tmp_path):
    proc, tenant, keys, chunks = node(tmp_path)
    try:
        body = descriptor(keys)
        endpoint = grant(proc, tenant, body)["endpoint"]
        for ticket in ("forged.AAAA", ""):
            reply = reply_without_body(endpoint, ticket, BIG)
            assert reply["ok"] is False and reply["error"]["code"] == "AccessDenied", reply
        # A request line is a ticket, not a megabyte: a long one is refused before it is buffered whole.
        with connect(endpoint) as s:
            s.sendall(json.dumps({"op": "kv-get", "body": 0, "ticket": "x" * (20 << 10)}).encode() + b"\n")
            reply = json.loads(s.makefile("rb").readline())
        assert reply["ok"] is False and reply["error"]["code"] == "InvalidRequest" and "longer than" in reply["error"]["message"]
        # A real ticket announcing another body length than its descriptor's: refused unread too.
        g = grant(proc, tenant, body)
        reply = reply_without_body(endpoint, g["ticket"], BIG)
        assert reply["ok"] is False and reply["error"]["code"] == "AccessDenied" and "another descriptor" in reply["error"]["message"]
        # The ticket was not spent by the refused attempt: the real request still runs.
        with connect(endpoint) as s:
            s.sendall(json.dumps({"op": "kv-get", "body": len(body), "ticket": g["ticket"]}).encode() + b"\n" + body)
            assert json.loads(s.makefile("rb").readline())["ok"] is True
    finally:
        proc.stop()


@pytest.fixture
def capped(tmp_path):
    proc, tenant, keys, chunks = node(tmp_path, "data_max_connections = 8\ndata_request_timeout_s = 1.0\n")
    yield proc, tenant, keys, chunks
    proc.stop()


def test_connections_beyond_the_cap_are_refused_and_idle_ones_time_out(capped):
    proc, tenant, keys, chunks = capped
    endpoint = grant(proc, tenant, descriptor(keys))["endpoint"]
    idle = [connect(endpoint) for _ in range(8)]
    try:
        with connect(endpoint) as extra:
            refused = json.loads(extra.makefile("rb").readline())
        assert refused["ok"] is False and refused["error"]["code"] == "ServiceUnavailable", refused
        for s in idle:  # each is told why and closed once its request timeout passed
            reply = json.loads(s.makefile("rb").readline())
            assert reply["error"]["code"] == "RequestTimeout", reply
    finally:
        for s in idle:
            s.close()

    async def fetch():
        async with client(proc, tenant, "data") as c:
            c.direct = True
            return await c.fetch(keys, LAYOUT, "http")

    payload, stats = run(fetch())
    assert stats.direct and np.array_equal(payload.reshape(-1), reference(LAYOUT, chunks).reshape(-1))
