"""GetObject with x-amz-rdma-token (the S3-over-RDMA convention), real servers, NIXL over UCX on loopback."""

from __future__ import annotations

import numpy as np
import pytest
from kvsupport import client, run
from rawhttp import signed

from client_sdk import ObjectCacheError
from client_sdk.rdma import rdma_available
from protocol.rdma_token import RdmaToken

pytestmark = pytest.mark.skipif(not rdma_available()[0], reason=f"rdma transport unavailable here: {rdma_available()[1]}")
BODY = np.random.default_rng(7).integers(0, 256, (9 << 20) + 5, dtype=np.uint8).tobytes()  # two 8 MiB staging pieces, the second partial


@pytest.fixture(scope="module")
def token_bucket(server, tenants, s3):
    s3.create_bucket(Bucket="rdma-token")
    s3.put_object(Bucket="rdma-token", Key="big", Body=BODY, ContentType="application/x-test")
    s3.put_object(Bucket="rdma-token", Key="empty", Body=b"")
    return "rdma-token"


def test_a_whole_object_lands_in_registered_memory_and_the_response_has_no_body(server, tenants, token_bucket):
    async def go():
        async with client(server, tenants["alice"], token_bucket) as c:
            assert (await c.get_object_rdma("big")).tobytes() == BODY
            assert (await c.get_object_rdma("empty")).tobytes() == b""
            async with c.rdma_memory(len(BODY)) as (token, view):
                r = signed(server.endpoint, tenants["alice"], "GET", f"/{token_bucket}/big", headers={"x-amz-rdma-token": token})
                assert r.status == 200 and r.body == b"" and r.headers["Content-Length"] == "0"
                assert r.headers["x-amz-rdma-reply"] == "200" and r.headers["x-amz-rdma-bytes-transferred"] == str(len(BODY))
                assert r.headers["Content-Type"] == "application/x-test" and r.headers["ETag"]
                assert bytes(view[: len(BODY)]) == BODY

    run(go())


def test_what_does_not_fit_is_declined_with_501_naming_why(server, tenants, token_bucket):
    def get(tenant, token: str, path: str = f"/{token_bucket}/big", **headers):
        return signed(server.endpoint, tenant, "GET", path, headers={"x-amz-rdma-token": token, **headers})

    async def go():
        async with client(server, tenants["alice"], token_bucket) as c:
            async with c.rdma_memory(len(BODY)) as (token, view):
                view[:64] = b"\0" * 64
                mine = RdmaToken.parse(token)
                for r, why in [
                    (get(tenants["alice"], token, Range="bytes=0-9"), b"whole objects"),
                    (get(tenants["alice"], RdmaToken(mine.addr, 1000).encode()), b"more than the 1000 bytes"),
                    (get(tenants["alice"], RdmaToken(4096, len(BODY)).encode()), b"does not describe memory"),
                ]:
                    assert r.status == 501 and b"NotImplemented" in r.body and why in r.body, r.body
                    assert r.headers["x-amz-rdma-reply"] == "501"
                assert bytes(view[:64]) == b"\0" * 64  # nothing was written
                # Another tenant presenting alice's token for its own object: never written for bob.
                signed(server.endpoint, tenants["bob"], "PUT", "/rdma-token-bob")
                signed(server.endpoint, tenants["bob"], "PUT", "/rdma-token-bob/x", body=b"bob's bytes")
                r = get(tenants["bob"], token, "/rdma-token-bob/x")
                assert r.status == 501 and b"this tenant registered" in r.body
                assert bytes(view[:64]) == b"\0" * 64
            r = get(tenants["alice"], "12:34")
            assert r.status == 400 and b"InvalidArgument" in r.body and b"x-amz-rdma-token" in r.body
            with pytest.raises(ObjectCacheError) as e:
                await c.get_object_rdma("no-such-key")
            assert e.value.code.name == "NoSuchKey"

    run(go())
