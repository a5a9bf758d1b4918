"""polars and obstore (Python bindings of Rust's object_store) on ObjectCache: parquet written by polars and scanned
back lazily with a filter; object_store's conditional puts (PutMode create / update), copy without overwrite
(its multipart copy-if-not-exists) and a multipart put."""

from __future__ import annotations

import os

import pytest

pl = pytest.importorskip("polars", reason="polars is in the clients extra (make test installs it)")
obstore = pytest.importorskip("obstore", reason="obstore is in the clients extra (make test installs it)")
from obstore.exceptions import AlreadyExistsError, PreconditionError  # noqa: E402
from obstore.store import S3Store  # noqa: E402


def polars_options(server, tenant) -> dict[str, str]:
    return {"aws_endpoint_url": server.endpoint, "aws_access_key_id": tenant.access_key, "aws_secret_access_key": tenant.secret_key,
            "aws_region": "us-east-1", "aws_allow_http": "true"}


@pytest.fixture
def store(server, tenants, bucket):
    t = tenants["alice"]
    return S3Store(bucket, endpoint=server.endpoint, access_key_id=t.access_key, secret_access_key=t.secret_key, region="us-east-1",
                   conditional_put="etag", copy_if_not_exists="multipart", client_options={"allow_http": True})


def test_polars_parquet_round_trip_with_a_lazy_filter(server, tenants, bucket):
    opts = polars_options(server, tenants["alice"])
    for part in range(3):
        df = pl.DataFrame({"part": [part] * 50, "n": list(range(part * 50, part * 50 + 50)), "label": [f"row {i}" for i in range(50)]})
        df.write_parquet(f"s3://{bucket}/frames/part-{part}.parquet", storage_options=opts)
    got = (pl.scan_parquet(f"s3://{bucket}/frames/*.parquet", storage_options=opts)
           .filter(pl.col("n") % 7 == 0).select("n", "label").sort("n").collect())
    assert got["n"].to_list() == [n for n in range(150) if n % 7 == 0]
    assert got["label"].to_list() == [f"row {n % 50}" for n in range(150) if n % 7 == 0]


def test_object_store_conditional_puts(store):
    first = obstore.put(store, "_log/00000.json", b'{"v": 0}', mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "_log/00000.json", b'{"v": "lost"}', mode="create")
    assert obstore.get(store, "_log/00000.json").bytes().to_bytes() == b'{"v": 0}'
    second = obstore.put(store, "_log/00000.json", b'{"v": 1}', mode={"e_tag": first["e_tag"]})
    with pytest.raises(PreconditionError):  # a stale ETag
        obstore.put(store, "_log/00000.json", b'{"v": "stale"}', mode={"e_tag": first["e_tag"]})
    with pytest.raises(PreconditionError):  # an update of an object that does not exist
        obstore.put(store, "_log/missing.json", b"{}", mode={"e_tag": first["e_tag"]})
    assert obstore.head(store, "_log/00000.json")["e_tag"] == second["e_tag"]
    assert obstore.get(store, "_log/00000.json").bytes().to_bytes() == b'{"v": 1}'


def test_object_store_copy_without_overwrite_and_a_multipart_put(store):
    data = os.urandom(11 * 1024 * 1024)
    obstore.put(store, "big.bin", data, use_multipart=True, chunk_size=5 * 1024 * 1024)
    assert "-" in obstore.head(store, "big.bin")["e_tag"]  # stored as a multipart object
    obstore.copy(store, "big.bin", "copy.bin", overwrite=False)
    with pytest.raises(AlreadyExistsError):
        obstore.copy(store, "big.bin", "copy.bin", overwrite=False)
    assert obstore.get_range(store, "copy.bin", start=6 * 1024 * 1024, length=1000).to_bytes() == data[6 * 1024 * 1024:6 * 1024 * 1024 + 1000]
    assert obstore.get(store, "copy.bin").bytes().to_bytes() == data
