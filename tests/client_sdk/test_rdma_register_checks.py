"""kv-register-rdma refuses, at registration, memory no engine could address (a range beyond 64-bit
addresses, a negative or oversized device id), naming the field: before, it was accepted and the
kv-get writing into it failed 500. Real NIXL agent metadata, so only the checked field is wrong."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from rawhttp import signed

from client_sdk.rdma import NixlClient, rdma_available

pytestmark = pytest.mark.skipif(not rdma_available()[0], reason=f"rdma transport unavailable here: {rdma_available()[1]}")


@pytest.fixture(scope="module")
def agent():
    nixl = NixlClient()
    buf = np.zeros(1 << 16, np.uint8)
    buf[:16] = np.frombuffer(b"proof of memory!", np.uint8)
    handle = nixl.register(buf)
    yield {"engine": "nixl", "agent": base64.b64encode(nixl.metadata()).decode(), "addr": buf.ctypes.data, "size": buf.nbytes,
           "proof": b"proof of memory!".hex()}
    nixl.deregister(handle)


def register(server, tenant, body: dict):
    return signed(server.endpoint, tenant, "POST", "/?kv-register-rdma", body=json.dumps(body).encode())


@pytest.mark.parametrize("change, field", [
    ({"addr": 2**70}, "addr"),
    ({"addr": 2**64 - 4096}, "addr"),  # the range would wrap past the last address
    ({"device": -1}, "device"),
    ({"device": 2**40}, "device"),
    ({"size": 2**47}, "size"),
])
def test_an_unaddressable_registration_is_refused_naming_the_field(server, tenants, agent, change, field):
    r = register(server, tenants["alice"], {**agent, **change})
    assert r.status == 400 and b"InvalidArgument" in r.body and f"<ArgumentName>{field}</ArgumentName>".encode() in r.body, r.body


def test_the_same_registration_with_sane_fields_is_accepted(server, tenants, agent):
    r = register(server, tenants["alice"], agent)
    assert r.status == 200, r.body
    reply = json.loads(r.body)
    r = signed(server.endpoint, tenants["alice"], "POST", "/?kv-unregister",
               body=json.dumps({"region_id": reply["region_id"], "token": reply["token"]}).encode())
    assert r.status == 200, r.body
