"""``kv-estimate`` on a node that is not in a cluster: a clear NotImplemented, after the usual checks."""

from __future__ import annotations

import json

from rawhttp import signed

BODY = {"keys": ["k0"], "candidates": ["anywhere"], "chunk_bytes": 256, "num_layers": 8}


def test_a_node_without_a_cluster_says_kv_estimate_needs_one(server, tenants, s3, bucket):
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?kv-estimate", {}, json.dumps(BODY).encode())
    assert r.status == 501 and b"<Code>NotImplemented</Code>" in r.body and b"cluster.node_id" in r.body
    # Another tenant's bucket is refused first, naming the field.
    r = signed(server.endpoint, tenants["bob"], "POST", f"/{bucket}?kv-estimate", {}, json.dumps(BODY).encode())
    assert r.status == 403 and b"<ArgumentName>bucket</ArgumentName>" in r.body
