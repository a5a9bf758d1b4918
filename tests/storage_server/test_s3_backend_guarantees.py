"""Guarantees of the ``s3`` backend the README gives (section "The s3 backend"), against moto's server:

* a bucket deleted and created again never serves the old bytes from a node's chunk cache;
* a part larger than ``store.s3.part_bytes`` is refused;
* an unavailable upstream is ``503`` after exactly ``store.s3.max_attempts`` tries.
"""

from __future__ import annotations

import http.client
import http.server
import threading
from pathlib import Path

import boto3
import numpy as np
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from kvsupport import client, keys_for, make_chunks, reference, run, tiny_layout
from support import ServerProcess, TenantKeys, boto_client, make_tenants
from upstream import KEYS, MotoServer

LAYOUT = tiny_layout(16, num_layers=4)
MAX_ATTEMPTS = 3


class SwitchableProxy:
    """Forwards every request to moto, or, once ``fail`` is set, answers 503 SlowDown itself and counts them."""

    def __init__(self, target_port: int) -> None:
        proxy = self
        self.fail = threading.Event()
        self.refused: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.fail.is_set():
                    proxy.refused.append(f"{self.command} {self.path}")
                    doc = b"<Error><Code>SlowDown</Code><Message>busy</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    self.wfile.write(doc)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                conn.request(self.command, self.path, body=body or None, headers=dict(self.headers.items()))
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                # A HEAD's length is the object's, not of the (empty) body.
                self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def node_config(root: Path, name: str, endpoint: str, tenants: list[TenantKeys]) -> Path:
    text = (f'[store]\nbackend = "s3"\ndata_dir = "{root / (name + "-data")}"\n'
            f'[store.s3]\nendpoint_url = "{endpoint}"\naccess_key = "{KEYS[0]}"\nsecret_key = "{KEYS[1]}"\n'
            f"max_attempts = {MAX_ATTEMPTS}\nconnect_timeout_s = 1\nread_timeout_s = 10\n"
            f"[cache]\nmax_bytes = {1 << 30}\n"
            f'[storage_server]\nsocket = "{root / name}.sock"\n')
    text += "".join(f'[[tenants]]\nname = "{t.name}"\naccess_key = "{t.access_key}"\nsecret_key = "{t.secret_key}"\n' for t in tenants)
    (root / f"{name}.toml").write_text(text)
    return root / f"{name}.toml"


@pytest.fixture(scope="module")
def upstream_nodes(tmp_path_factory):
    """moto, a switchable proxy in front of it, node A through the proxy and node B straight to moto."""
    root = tmp_path_factory.mktemp("s3guarantees")
    moto = MotoServer(root / "moto.log").start()
    proxy = SwitchableProxy(moto.port)
    alice = make_tenants("alice")[0]
    a = ServerProcess(node_config(root, "a", proxy.endpoint, [alice])).start()
    b = ServerProcess(node_config(root, "b", moto.endpoint, [alice])).start()
    yield proxy, a, b, alice
    for n in (a, b):
        n.stop()
    proxy.stop()
    moto.stop()


async def _put(node, tenant, bucket, keys, chunks):
    async with client(node, tenant, bucket) as c:
        await c.put_chunks(keys, chunks, LAYOUT)


async def _fetch(node, tenant, bucket, keys):
    async with client(node, tenant, bucket) as c:
        return (await c.fetch(keys, LAYOUT, "shm"))[0]


def test_a_bucket_deleted_and_created_again_never_serves_the_old_bytes(upstream_nodes):
    """Node A caches the old chunks (it put them), deletes them and the bucket and creates the bucket again;
    node B then puts other bytes under the same keys. A's kv-get must fetch those, not serve its cached copies."""
    _, a, b, alice = upstream_nodes
    s3a = boto_client(a.endpoint, alice)
    keys = keys_for(LAYOUT, 6, "incarnation")
    old, new = make_chunks(LAYOUT, 6, seed=50), make_chunks(LAYOUT, 6, seed=51)
    s3a.create_bucket(Bucket="reborn")
    run(_put(a, alice, "reborn", keys, old))
    assert np.array_equal(run(_fetch(a, alice, "reborn", keys)), reference(LAYOUT, old))  # served from A's cache
    s3a.delete_objects(Bucket="reborn", Delete={"Objects": [{"Key": k} for k in keys]})
    s3a.delete_bucket(Bucket="reborn")
    s3a.create_bucket(Bucket="reborn")
    run(_put(b, alice, "reborn", keys, new))
    assert np.array_equal(run(_fetch(a, alice, "reborn", keys)), reference(LAYOUT, new))


def test_a_part_over_part_bytes_is_refused(upstream_nodes):
    _, a, _, alice = upstream_nodes
    s3a = boto_client(a.endpoint, alice)
    s3a.create_bucket(Bucket="parts")
    upload = s3a.create_multipart_upload(Bucket="parts", Key="mp")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3a.upload_part(Bucket="parts", Key="mp", UploadId=upload, PartNumber=1, Body=b"x" * ((8 << 20) + 1))
    assert e.value.response["Error"]["Code"] == "EntityTooLarge"
    part = s3a.upload_part(Bucket="parts", Key="mp", UploadId=upload, PartNumber=1, Body=b"y" * (8 << 20))  # at the limit: fine
    s3a.complete_multipart_upload(Bucket="parts", Key="mp", UploadId=upload,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert s3a.head_object(Bucket="parts", Key="mp")["ContentLength"] == 8 << 20


def test_an_unavailable_upstream_is_503_after_max_attempts_tries(upstream_nodes):
    proxy, a, _, alice = upstream_nodes
    s3a = boto3.client("s3", endpoint_url=a.endpoint, aws_access_key_id=alice.access_key, aws_secret_access_key=alice.secret_key,
                       region_name="us-east-1", config=BotoConfig(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}))
    s3a.create_bucket(Bucket="busy")
    s3a.put_object(Bucket="busy", Key="k", Body=b"stored")
    proxy.refused.clear()
    proxy.fail.set()
    try:
        with pytest.raises(ClientError) as e:
            s3a.get_object(Bucket="busy", Key="k")
        refused = list(proxy.refused)
    finally:
        proxy.fail.clear()
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503 and e.value.response["Error"]["Code"] == "ServiceUnavailable"
    # One upstream request failed: it was tried exactly max_attempts times, and nothing else of the bucket was asked
    # (the node's own background probes of the upstream, "GET /", may fall in the same moment).
    asked = [r for r in refused if r.startswith("GET /busy/")]
    assert len(asked) == MAX_ATTEMPTS and len(set(asked)) == 1, refused
    assert s3a.get_object(Bucket="busy", Key="k")["Body"].read() == b"stored"  # and the node serves again at once
