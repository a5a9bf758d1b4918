"""Store-independent S3 rules, as pure functions."""

from __future__ import annotations

import pytest

from protocol.config import STORE_BACKENDS
from protocol.errors import ErrorCode, S3Error
from storage_server.store.factory import BACKENDS
from storage_server.store.object_store import ObjectMeta, PartInfo, PutSpec, UploadInfo
from storage_server.store.rules import MIN_PART_SIZE, check_immutable_reput, common_prefix, completed_meta, select_parts

UPLOAD = UploadInfo("u1", "b", "k", 0.0, "alice", PutSpec(checksum_algorithms=("CRC32",)))


def part(n: int, size: int, etag: str) -> tuple[PartInfo, str]:
    return PartInfo(n, size, f'"{etag}"', 0.0, {"CRC32": "AAAAAA=="}), f"file-{n}"


def test_every_configurable_backend_has_a_factory():
    assert set(BACKENDS) == set(STORE_BACKENDS)


@pytest.mark.parametrize("key,prefix,delimiter,expected", [
    ("a/b/c", "", "/", "a/"),
    ("a/b/c", "a/", "/", "a/b/"),
    ("a/b", "a/b", "/", None),
    ("abc", "", "", None),
    ("x--y--z", "x--", "--", "x--y--"),
])
def test_common_prefix_rolls_up_through_the_first_delimiter_after_the_prefix(key, prefix, delimiter, expected):
    assert common_prefix(key, prefix, delimiter) == expected


def test_an_immutable_chunk_may_only_be_put_again_with_the_same_bytes():
    a = ObjectMeta("b", "k", 3, '"x"', 0.0)
    check_immutable_reput(a, ObjectMeta("b", "k", 3, '"x"', 1.0))
    with pytest.raises(S3Error) as e:
        check_immutable_reput(a, ObjectMeta("b", "k", 3, '"y"', 1.0))
    assert e.value.code == ErrorCode.InvalidRequest and e.value.extra == {"Key": "k"}


def test_parts_must_be_ascending_named_by_their_etag_and_large_enough_before_the_last():
    stored = {1: part(1, MIN_PART_SIZE, "aa"), 2: part(2, 10, "bb"), 3: part(3, 10, "cc")}
    assert [p.part_number for p, _ in select_parts(UPLOAD, [(1, "aa", {}), (3, '"cc"', {})], stored)] == [1, 3]
    for requested, code in [
        ([], ErrorCode.MalformedXML),
        ([(2, "bb", {}), (1, "aa", {})], ErrorCode.InvalidPartOrder),
        ([(1, "aa", {}), (4, "dd", {})], ErrorCode.InvalidPart),
        ([(1, "zz", {})], ErrorCode.InvalidPart),
        ([(1, "aa", {"CRC32": "BBBBBB=="})], ErrorCode.InvalidPart),
        ([(2, "bb", {}), (3, "cc", {})], ErrorCode.EntityTooSmall),
    ]:
        with pytest.raises(S3Error) as e:
            select_parts(UPLOAD, requested, stored)
        assert e.value.code == code, requested


def test_a_completed_upload_has_the_multipart_etag_and_composite_checksums():
    parts = [part(1, MIN_PART_SIZE, "00" * 16)[0], part(2, 7, "11" * 16)[0]]
    meta = completed_meta(UPLOAD, parts, 5.0)
    assert meta.etag == '"' + __import__("hashlib").md5(bytes.fromhex("00" * 16 + "11" * 16)).hexdigest() + '-2"'
    assert meta.size == MIN_PART_SIZE + 7 and meta.part_sizes == (MIN_PART_SIZE, 7) and meta.checksums["CRC32"].endswith("-2")
