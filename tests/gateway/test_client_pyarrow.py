"""pyarrow's S3FileSystem (the AWS C++ SDK) on ObjectCache: a hive-partitioned parquet dataset written with
pyarrow.dataset and read back with a filter that prunes partitions, and a multipart output stream."""

from __future__ import annotations

import os

import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow is in the clients extra (make test installs it)")
ds = pytest.importorskip("pyarrow.dataset")
pafs = pytest.importorskip("pyarrow.fs")

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # never ask for instance credentials


@pytest.fixture
def s3fs_arrow(server, tenants):
    host = server.endpoint.removeprefix("http://")
    return pafs.S3FileSystem(access_key=tenants["alice"].access_key, secret_key=tenants["alice"].secret_key, endpoint_override=host,
                             scheme="http", region="us-east-1", allow_bucket_creation=False)


def test_partitioned_dataset_round_trip_with_a_filter(s3fs_arrow, bucket):
    years = [2023, 2024, 2025] * 40
    table = pa.table({"year": years, "id": list(range(len(years))), "value": [float(i) / 3 for i in range(len(years))]})
    ds.write_dataset(table, f"{bucket}/sales", format="parquet", partitioning=["year"], partitioning_flavor="hive",
                     filesystem=s3fs_arrow)
    listed = sorted(info.path for info in s3fs_arrow.get_file_info(pafs.FileSelector(f"{bucket}/sales", recursive=True)) if info.is_file)
    assert [p.split("/")[2] for p in listed] == ["year=2023", "year=2024", "year=2025"]
    dataset = ds.dataset(f"{bucket}/sales", format="parquet", partitioning="hive", filesystem=s3fs_arrow)
    assert len(list(dataset.get_fragments(filter=ds.field("year") == 2024))) == 1  # the filter prunes the other partitions
    got = dataset.to_table(filter=(ds.field("year") == 2024) & (ds.field("id") >= 60)).sort_by("id")
    want = [i for i, y in enumerate(years) if y == 2024 and i >= 60]
    assert got.column("id").to_pylist() == want
    assert got.column("value").to_pylist() == [float(i) / 3 for i in want]


def test_a_multipart_output_stream(s3fs_arrow, s3, bucket):
    data = os.urandom(12 * 1024 * 1024)  # past the SDK's part size: a multipart upload
    with s3fs_arrow.open_output_stream(f"{bucket}/big.bin") as out:
        for i in range(0, len(data), 1 << 20):
            out.write(data[i:i + (1 << 20)])
    assert "-" in s3.head_object(Bucket=bucket, Key="big.bin")["ETag"]  # stored as a multipart object
    with s3fs_arrow.open_input_file(f"{bucket}/big.bin") as f:
        assert f.size() == len(data)
        f.seek(5 * 1024 * 1024)
        assert f.read(4096) == data[5 * 1024 * 1024:5 * 1024 * 1024 + 4096]
        f.seek(0)
        assert f.read() == data
