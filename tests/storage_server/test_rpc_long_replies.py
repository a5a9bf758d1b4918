"""A kv-put of tens of thousands of tiny chunks answers 200 with every ETag (security audit round two, item 14: the
chunks were committed but the reply line outgrew the RPC's 1 MiB line limit and the client got 503).

The end-to-end test lowers both limits (the storage server's ``reply_line_limit``, the gateway client's
``line_limit``) on an in-process node, so a few hundred ETags take the framing that 27,000 take at the real
limits: the same code path without 27,000 durable puts. Its control run shows the lowered limits are in force
(without the framing, the same request is the audit's 503). The real limits' framing is checked in memory.
"""

from __future__ import annotations

import asyncio
import json

from inprocess import InProcessNode
from kvsupport import keys_for, tiny_layout
from rawhttp import signed
from support import boto_client, make_tenants, write_config

from gateway.storage_rpc import StorageServerClient
from protocol.rpc import MAX_REQUEST_LINE, decode_reply, encode_reply, reply_bytes
from protocol.wire import encode_keys, encode_put_batch
from storage_server.rpc_server import RpcServer

N = 300  # each ETag takes 40 bytes of the reply: 300 make a 12 KB reply, three times the lowered line limit
LINE = 4096  # the lowered line limit: the gateway's client reads lines up to this, the storage server frames from half


def put_body(keys: list[str]) -> bytes:
    batch = [(k, memoryview(i.to_bytes(2, "little"))) for i, k in enumerate(keys)]
    return b"".join(bytes(p) for p in encode_put_batch(batch))


def test_a_kv_put_whose_reply_outgrows_the_rpc_line_answers_every_etag(tmp_path, monkeypatch):
    monkeypatch.setattr(StorageServerClient, "line_limit", LINE)
    layout = tiny_layout(1, num_layers=1)  # 2-byte chunks: the reply, not the body, is what is large
    tenant = make_tenants("t")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n')
    node = InProcessNode(config).start()
    try:
        boto_client(node.endpoint, tenant).create_bucket(Bucket="many")

        # Control: with the storage server's framing above the client's line limit, the reply line overflows it.
        node.storage_server.rpc.reply_line_limit = 1 << 20
        r = signed(node.endpoint, tenant, "POST", "/many?kv-put", body=put_body(keys_for(layout, N, "control")))
        assert r.status == 503, (r.status, r.body[:300])

        node.storage_server.rpc.reply_line_limit = LINE // 2
        keys = keys_for(layout, N, "many")
        r = signed(node.endpoint, tenant, "POST", "/many?kv-put", body=put_body(keys))
        assert r.status == 200, r.body[:300]
        assert len(r.body) > LINE  # the reply really outgrew the line
        reply = json.loads(r.body)
        assert reply["stored"] == N and len(reply["etags"]) == N and len(set(reply["etags"])) > N // 2

        r = signed(node.endpoint, tenant, "POST", "/many?kv-lookup", body=encode_keys(keys))
        assert r.status == 200 and json.loads(r.body)["hits"] == N, r.body[:300]
    finally:
        node.stop()


def test_at_the_real_limits_a_27000_etag_reply_is_framed_within_the_line_the_gateway_reads():
    """The defaults agree: a reply of 27,000 ETags (1.08 MB, over the 1 MiB line limit) arrives whole through a
    reader limited as the gateway's client is."""
    assert RpcServer({}, max_body=0).reply_line_limit < StorageServerClient.line_limit == MAX_REQUEST_LINE
    fields = {"stored": 27_000, "etags": [f"{i:040x}" for i in range(27_000)]}
    wire = encode_reply(fields, RpcServer({}, max_body=0).reply_line_limit)
    assert len(wire) > MAX_REQUEST_LINE

    async def read() -> dict:
        reader = asyncio.StreamReader(limit=StorageServerClient.line_limit)
        reader.feed_data(wire)
        reader.feed_eof()
        reply = decode_reply(await reader.readline())
        if (n := reply_bytes(reply)) is not None:
            reply = decode_reply(await reader.readexactly(n))
        return reply

    assert asyncio.run(read()) == fields
