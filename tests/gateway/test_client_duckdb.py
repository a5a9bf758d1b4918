"""DuckDB's httpfs extension on ObjectCache: COPY ... TO 's3://...' (a multipart upload), hive-partitioned too, and
queries reading parquet and CSV back over S3. The extension comes from PyPI (duckdb-ext-httpfs, built for this
DuckDB): DuckDB's own download of it needs a network these tests never have."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb", reason="duckdb is in the clients extra (make test installs it)")


def httpfs_extension() -> Path | None:
    """The httpfs build duckdb-ext-httpfs installed for this DuckDB version, if any."""
    for entry in sys.path:
        found = sorted(Path(entry).glob(f"duckdb_ext/extensions/v{duckdb.__version__}/*/httpfs.duckdb_extension"))
        if found:
            return found[0]
    return None


@pytest.fixture
def con(server, tenants):
    ext = httpfs_extension()
    if ext is None:
        pytest.skip(f"duckdb-ext-httpfs for DuckDB {duckdb.__version__} is not installed (the clients extra pins the pair)")
    t = tenants["alice"]
    db = duckdb.connect()
    db.execute(f"LOAD '{ext}'")
    db.execute("SET autoinstall_known_extensions = false")
    db.execute(f"CREATE SECRET oc (TYPE s3, KEY_ID '{t.access_key}', SECRET '{t.secret_key}', REGION 'us-east-1', "
               f"ENDPOINT '{server.endpoint.removeprefix('http://')}', URL_STYLE 'path', USE_SSL false)")
    yield db
    db.close()


def test_copy_to_s3_and_query_back(con, s3, bucket):
    # Parts of 5 MiB (the file size limit over the part count), so this ~12 MiB COPY is a multipart upload.
    con.execute("SET s3_uploader_max_filesize = '50MiB'")
    con.execute("SET s3_uploader_max_parts_per_file = 10")
    con.execute(f"COPY (SELECT i AS id, i % 5 AS bucket5, 'item ' || i AS name, md5(i::VARCHAR) || md5((i * 7)::VARCHAR) AS digest "
                f"FROM range(200000) t(i)) TO 's3://{bucket}/items.parquet' (FORMAT parquet, COMPRESSION uncompressed)")
    assert "-" in s3.head_object(Bucket=bucket, Key="items.parquet")["ETag"]  # httpfs writes with a multipart upload
    assert con.execute(f"SELECT count(*), sum(id) FROM read_parquet('s3://{bucket}/items.parquet') WHERE bucket5 = 3").fetchone() == (
        40000, sum(i for i in range(200000) if i % 5 == 3))
    con.execute(f"COPY (SELECT id, name FROM read_parquet('s3://{bucket}/items.parquet') WHERE id < 100) TO 's3://{bucket}/small.csv' (HEADER)")
    assert s3.get_object(Bucket=bucket, Key="small.csv")["Body"].read().decode().splitlines()[:2] == ["id,name", "0,item 0"]
    assert con.execute(f"SELECT max(id) FROM read_csv('s3://{bucket}/small.csv')").fetchone() == (99,)


def test_partitioned_copy_and_a_pruned_glob(con, bucket):
    con.execute(f"COPY (SELECT i AS id, 2020 + i % 3 AS year FROM range(300) t(i)) TO 's3://{bucket}/by_year' (FORMAT parquet, PARTITION_BY (year))")
    rows = con.execute(f"SELECT year, count(*) FROM read_parquet('s3://{bucket}/by_year/*/*.parquet', hive_partitioning = true) "
                       "WHERE year >= 2021 GROUP BY year ORDER BY year").fetchall()
    assert rows == [(2021, 100), (2022, 100)]
