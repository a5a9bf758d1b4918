"""ListObjects v1/v2 and ListObjectVersions semantics."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from urllib.parse import quote

import pytest
from botocore.exceptions import ClientError
from rawhttp import signed

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
KEYS = ["a/1", "a/2", "a/b/3", "b/1", "b--x--1", "b--x--2", "c", "d/e/f", "é/ü", "sp ace/k"]


@pytest.fixture
def populated(s3, bucket):
    for k in KEYS:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    return bucket


def utf8_sorted(keys):
    return sorted(keys, key=lambda k: k.encode())


def test_v2_lists_everything_in_utf8_order(s3, populated):
    r = s3.list_objects_v2(Bucket=populated)
    assert [o["Key"] for o in r["Contents"]] == utf8_sorted(KEYS)
    assert r["KeyCount"] == len(KEYS) and not r["IsTruncated"]
    first = r["Contents"][0]
    assert first["Size"] == 3 and first["ETag"].startswith('"') and "Owner" not in first


def test_v2_prefix_and_delimiter(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/", "b/", "d/", "sp ace/", "é/"]
    assert [o["Key"] for o in r["Contents"]] == ["b--x--1", "b--x--2", "c"]
    assert r["KeyCount"] == 8
    r = s3.list_objects_v2(Bucket=populated, Prefix="a/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a/1", "a/2"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/b/"]


def test_multi_character_delimiter(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, Prefix="b", Delimiter="--x--")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b--x--"]
    assert [o["Key"] for o in r["Contents"]] == ["b/1"]


@pytest.mark.parametrize("page_size", [1, 2, 3, 7])
def test_v2_pagination_with_continuation_tokens(s3, populated, page_size):
    seen, prefixes, token = [], [], None
    while True:
        kw = {"Bucket": populated, "MaxKeys": page_size, "Delimiter": "/"}
        if token:
            kw["ContinuationToken"] = token
        r = s3.list_objects_v2(**kw)
        assert r["KeyCount"] <= page_size
        seen += [o["Key"] for o in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert seen == ["b--x--1", "b--x--2", "c"]
    assert prefixes == ["a/", "b/", "d/", "sp ace/", "é/"]


def test_v2_start_after_and_fetch_owner(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, StartAfter="b/1", FetchOwner=True)
    assert [o["Key"] for o in r["Contents"]] == utf8_sorted([k for k in KEYS if k.encode() > b"b/1"])
    assert r["StartAfter"] == "b/1"
    assert r["Contents"][0]["Owner"]["ID"] == "alice"


def test_v1_marker_pagination(s3, populated):
    seen = []
    for page in s3.get_paginator("list_objects").paginate(Bucket=populated, PaginationConfig={"PageSize": 3}):
        seen += [o["Key"] for o in page.get("Contents", [])]
    assert seen == utf8_sorted(KEYS)
    r = s3.list_objects(Bucket=populated, Marker="c", Delimiter="/", MaxKeys=1)
    assert r["IsTruncated"] and r["NextMarker"] == "d/"
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["d/"]
    assert r["Contents"][0]["Owner"]["ID"] == "alice" if "Contents" in r else True


def test_url_encoding_type(server, tenants, populated):
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{populated}?list-type=2&encoding-type=url&prefix=sp%20ace")
    assert r.status == 200
    assert b"<Key>sp%20ace/k</Key>" in r.body and b"<EncodingType>url</EncodingType>" in r.body


def test_explicit_url_encoding_returns_encoded_keys(s3, populated):
    # boto3 decodes only when it added encoding-type itself; asked explicitly, keys stay encoded.
    r = s3.list_objects(Bucket=populated, EncodingType="url")
    assert [o["Key"] for o in r["Contents"]] == [quote(k, safe="/") for k in utf8_sorted(KEYS)]


@pytest.mark.parametrize("bad", ["-1", "abc"])
def test_invalid_max_keys(server, tenants, bucket, bad):
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}?list-type=2&max-keys={bad}")
    assert r.status == 400 and b"<Code>InvalidArgument</Code>" in r.body


def test_invalid_encoding_type(server, tenants, bucket):
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}?encoding-type=base64")
    assert r.status == 400 and b"InvalidArgument" in r.body


def test_max_keys_zero_and_over_limit(s3, populated):
    r = s3.list_objects_v2(Bucket=populated, MaxKeys=0)
    assert r["KeyCount"] == 0 and "Contents" not in r and r["IsTruncated"] is False
    r = s3.list_objects_v2(Bucket=populated, MaxKeys=5000)
    assert r["MaxKeys"] == 1000 and r["KeyCount"] == len(KEYS)


def test_list_object_versions_unversioned(s3, populated):
    r = s3.list_object_versions(Bucket=populated, Prefix="a/")
    versions = r["Versions"]
    assert [v["Key"] for v in versions] == ["a/1", "a/2", "a/b/3"]
    assert all(v["VersionId"] == "null" and v["IsLatest"] for v in versions)
    r = s3.list_object_versions(Bucket=populated, Delimiter="/", MaxKeys=2)
    # "b--x--1" sorts before "b/" ('-' < '/'), so the first two entries are a/ and that key.
    assert r["IsTruncated"] and [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/"]
    assert [v["Key"] for v in r["Versions"]] == ["b--x--1"]
    r = s3.list_object_versions(Bucket=populated, Delimiter="/", KeyMarker=r["NextKeyMarker"])
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/", "d/", "sp ace/", "é/"]


def test_listing_missing_bucket(s3):
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket="missing-bucket-xyz")
    assert e.value.response["Error"]["Code"] == "NoSuchBucket"


@pytest.mark.parametrize("query", ["max-keys=0", "list-type=2&max-keys=0", "max-keys=0&delimiter=%2F", "list-type=2&max-keys=0&prefix=a%2F"])
def test_max_keys_zero_is_an_empty_page_that_is_not_truncated(server, tenants, s3, populated, query):
    """max-keys=0 asks for nothing: no keys, no prefixes, IsTruncated false (and no continuation)."""
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{populated}?{query}")
    doc = ET.fromstring(r.body)
    assert r.status == 200
    assert doc.findtext(f"{NS}IsTruncated") == "false" and doc.findtext(f"{NS}MaxKeys") == "0"
    assert doc.find(f"{NS}Contents") is None and doc.find(f"{NS}CommonPrefixes") is None
    assert doc.find(f"{NS}NextMarker") is None and doc.find(f"{NS}NextContinuationToken") is None
    v1 = s3.list_objects(Bucket=populated, MaxKeys=0)
    assert v1["IsTruncated"] is False and "Contents" not in v1


def test_max_keys_zero_still_needs_the_owners_bucket(s3_bob, populated):
    with pytest.raises(ClientError) as e:
        s3_bob.list_objects_v2(Bucket=populated, MaxKeys=0)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


ECHOED = {"prefix": "line\nbreak\r\tand %0A", "delimiter": "\n", "marker": "a\nb", "start-after": "a\r\nn"}


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_parameters_are_echoed_exactly_without_encoding_type(server, tenants, s3, bucket, version):
    """Without encoding-type=url, Prefix, Delimiter, Marker and StartAfter come back exactly as sent
    (a newline as a newline, a carriage return as a carriage return, a literal '%0A' as itself)."""
    s3.put_object(Bucket=bucket, Key="line\nbreak\r\tand %0A/k\nx", Body=b"x")
    names = ["prefix", "delimiter", "marker"] if version == "v1" else ["prefix", "delimiter", "start-after"]
    query = "&".join(f"{n}={quote(ECHOED[n], safe='')}" for n in names) + ("&list-type=2" if version == "v2" else "")
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}?{query}")
    assert r.status == 200, r.body
    doc = ET.fromstring(r.body)
    for name, tag in [("prefix", "Prefix"), ("delimiter", "Delimiter"), ("marker", "Marker"), ("start-after", "StartAfter")]:
        if name in names:
            assert doc.findtext(f"{NS}{tag}") == ECHOED[name], tag
    assert [p.findtext(f"{NS}Prefix") for p in doc.iter(f"{NS}CommonPrefixes")] == ["line\nbreak\r\tand %0A/k\n"]
    assert doc.find(f"{NS}EncodingType") is None
