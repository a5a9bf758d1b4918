"""A data ticket is bound to the bucket's incarnation, not only its name.

A ticket minted for alice's bucket must not outlive that bucket: once she deletes it and
bob creates a bucket of the same name with chunks under the same keys, presenting the
ticket on the data endpoint is refused, and none of bob's bytes are sent. On both backends
(the s3 one over moto's server).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from rawhttp import signed
from support import ServerProcess, boto_client, make_tenants, write_config
from upstream import MotoServer

from protocol.data_ticket import GRANT_CONTENT_TYPE, HEADER_DIRECT
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

LAYOUT = tiny_layout(16, num_layers=4)
N = 4


@pytest.fixture(params=["local", "s3"])
def node(tmp_path: Path, request):
    people = {t.name: t for t in make_tenants("alice", "bob")}
    moto = MotoServer(tmp_path / "moto.log").start() if request.param == "s3" else None
    config = write_config(tmp_path / "c.toml", tmp_path / "data", list(people.values()),
                          extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\ndata_listen = "127.0.0.1:0"\n')
    if moto:  # the s3 backend over moto: backend in [store], then the [store.s3] table
        config.write_text(config.read_text().replace("[store]\n", '[store]\nbackend = "s3"\n', 1) + "\n" + moto.config())
    proc = ServerProcess(config).start()
    try:
        yield proc, people
    finally:
        proc.stop()
        if moto:
            moto.stop()


def _descriptor(keys: list[str]) -> bytes:
    target = Target(TransportKind.HTTP, length=len(keys) * LAYOUT.chunk_bytes)
    return encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, target))


def _data_get(endpoint: str, ticket: str, body: bytes) -> tuple[dict, bytes]:
    host, _, port = endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(json.dumps({"op": "kv-get", "body": len(body), "ticket": ticket}).encode() + b"\n" + body)
        f = s.makefile("rb")
        return json.loads(f.readline()), f.read()


async def _put(node, tenant, bucket: str, keys: list[str], seed: int) -> None:
    async with client(node, tenant, bucket) as c:
        assert await c.put_chunks(keys, make_chunks(LAYOUT, len(keys), seed=seed), LAYOUT) == len(keys)


def test_a_ticket_for_a_deleted_bucket_is_refused_after_another_tenant_recreates_it(node):
    proc, people = node
    alice, bob = boto_client(proc.endpoint, people["alice"]), boto_client(proc.endpoint, people["bob"])
    keys = keys_for(LAYOUT, N, "shared-name")
    body = _descriptor(keys)
    alice.create_bucket(Bucket="reused")
    run(_put(proc, people["alice"], "reused", keys, seed=1))
    r = signed(proc.endpoint, people["alice"], "POST", "/reused?kv-get", headers={HEADER_DIRECT: "1"}, body=body)
    assert r.status == 200 and r.headers["Content-Type"].startswith(GRANT_CONTENT_TYPE), r.body
    grant = json.loads(r.body)
    alice.delete_objects(Bucket="reused", Delete={"Objects": [{"Key": k} for k in keys]})
    alice.delete_bucket(Bucket="reused")
    bob.create_bucket(Bucket="reused")
    run(_put(proc, people["bob"], "reused", keys, seed=2))
    reply, rest = _data_get(grant["endpoint"], grant["ticket"], body)
    assert not reply.get("ok") and reply["error"]["code"] == "AccessDenied", reply
    assert rest == b""
