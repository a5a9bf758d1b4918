"""The SDK raises only ObjectCacheError, naming the problem (issue 23 item 3): never botocore's exceptions."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from kvsupport import run, tiny_layout
from support import TenantKeys

from client_sdk import ObjectCacheClient, ObjectCacheError, chunk_keys

LAYOUT = tiny_layout(16, num_layers=2)


def _dead_endpoint() -> str:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _calls(endpoint: str, tenant: TenantKeys, bucket: str) -> dict[str, BaseException | None]:
    """Each public call the README shows, with the error it raised (None: it succeeded)."""
    keys = chunk_keys(np.arange(16), 16, "errtypes")
    chunk = np.zeros(LAYOUT.chunk_bytes, np.uint8)
    out: dict[str, BaseException | None] = {}
    async with ObjectCacheClient(endpoint, tenant.access_key, tenant.secret_key, bucket=bucket, retries=0) as c:
        for name, call in [("ensure_bucket", c.ensure_bucket), ("put_chunks", lambda: c.put_chunks(keys, [chunk], LAYOUT)),
                           ("lookup", lambda: c.lookup(keys)), ("fetch", lambda: c.fetch(keys, LAYOUT, transport="http")),
                           ("status", c.status)]:
            try:
                await call()
                out[name] = None
            except BaseException as e:  # noqa: BLE001 - the test is about which type escapes
                out[name] = e
    return out


def test_a_wrong_secret_is_an_objectcache_error_naming_the_signature(server, tenants):
    alice = tenants["alice"]
    errors = run(_calls(server.endpoint, TenantKeys("alice", alice.access_key, alice.secret_key + "x"), "sdk-errtypes"))
    for name, e in errors.items():
        assert isinstance(e, ObjectCacheError), f"{name} raised {type(e).__module__}.{type(e).__name__}: {e}"
        assert e.code.name == "SignatureDoesNotMatch", f"{name}: {e}"
    assert "secret key" in str(errors["ensure_bucket"]) and "sdk-errtypes" in str(errors["ensure_bucket"])


def test_an_unknown_access_key_is_named(server):
    errors = run(_calls(server.endpoint, TenantKeys("nobody", "AKNOBODY0000000000", "s" * 30), "sdk-errtypes"))
    for name, e in errors.items():
        assert isinstance(e, ObjectCacheError) and e.code.name == "InvalidAccessKeyId", f"{name}: {e!r}"


def test_an_unreachable_endpoint_is_an_objectcache_error_naming_it(tenants):
    endpoint = _dead_endpoint()
    errors = run(_calls(endpoint, tenants["alice"], "sdk-errtypes"))
    for name, e in errors.items():
        assert isinstance(e, ObjectCacheError), f"{name} raised {type(e).__module__}.{type(e).__name__}: {e}"
        assert e.code.name == "ServiceUnavailable" and endpoint in str(e), f"{name}: {e}"


def test_ensure_bucket_still_creates_a_missing_bucket_and_refuses_another_tenants(server, tenants, s3_bob):
    s3_bob.create_bucket(Bucket="sdk-errtypes-bob")
    try:
        async def go():
            async with ObjectCacheClient(server.endpoint, tenants["alice"].access_key, tenants["alice"].secret_key,
                                         bucket="sdk-errtypes-new") as c:
                await c.ensure_bucket()
                await c.ensure_bucket()  # present now: nothing to do
                c.bucket = "sdk-errtypes-bob"
                with pytest.raises(ObjectCacheError) as e:
                    await c.ensure_bucket()
                assert e.value.code.name == "AccessDenied"
        run(go())
    finally:
        s3_bob.delete_bucket(Bucket="sdk-errtypes-bob")
