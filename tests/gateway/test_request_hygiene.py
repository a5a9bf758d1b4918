"""Malformed or ambiguous requests get a clear S3 error and change nothing (security audit, defects 8 and 10)."""

from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError
from rawhttp import send, sign, signed


def code_of(body: bytes) -> str:
    return ET.fromstring(body).findtext("Code") or ""


def md5_header(body: bytes) -> dict[str, str]:
    return {"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()}


def test_invalid_utf8_in_a_key_is_refused_so_different_keys_never_collide(server, tenants, s3, bucket):
    for raw in ("inv%ff", "inv%fe"):
        r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/{raw}", body=raw.encode())
        assert r.status == 400 and code_of(r.body) == "InvalidURI", r.body
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_invalid_utf8_in_a_query_parameter_is_refused(server, tenants, bucket):
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}?list-type=2&prefix=%ff")
    assert r.status == 400 and code_of(r.body) == "InvalidURI"


def test_content_length_together_with_transfer_encoding_is_refused(server, tenants, bucket, s3):
    body = b"5\r\nhello\r\n0\r\n\r\n"
    headers = sign(tenants["alice"], "PUT", f"{server.endpoint}/{bucket}/smuggle", {"Content-Length": str(len(body))},
                   payload_hash="UNSIGNED-PAYLOAD")
    headers["Transfer-Encoding"] = "chunked"
    r = send(server.endpoint, "PUT", f"/{bucket}/smuggle", headers, body)
    assert r.status == 400
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="smuggle")


def test_delete_objects_needs_an_integrity_header(server, tenants, s3, bucket):
    s3.put_object(Bucket=bucket, Key="keep", Body=b"x")
    body = b"<Delete><Object><Key>keep</Key></Object></Delete>"
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?delete", body=body)
    assert r.status == 400 and code_of(r.body) == "InvalidRequest" and b"Content-MD5" in r.body
    assert s3.get_object(Bucket=bucket, Key="keep")["Body"].read() == b"x"
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?delete", headers=md5_header(body), body=body)
    assert r.status == 200 and b"<Deleted><Key>keep</Key></Deleted>" in r.body


def test_delete_objects_reports_a_key_over_1024_bytes_as_its_own_error(server, tenants, s3, bucket):
    s3.put_object(Bucket=bucket, Key="short", Body=b"x")
    long_key = "k" * 1025
    body = f"<Delete><Object><Key>{long_key}</Key></Object><Object><Key>short</Key></Object></Delete>".encode()
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?delete", headers=md5_header(body), body=body)
    doc = ET.fromstring(r.body)
    ns = {"s3": doc.tag.split("}")[0].strip("{")} if doc.tag.startswith("{") else {}
    errors = doc.findall("s3:Error", ns) if ns else doc.findall("Error")
    assert r.status == 200 and [(e.findtext("s3:Code", namespaces=ns) if ns else e.findtext("Code")) for e in errors] == ["KeyTooLongError"]
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="short")


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x1f", "\ufffe"])
def test_keys_and_listing_parameters_xml_cannot_carry_are_refused(server, tenants, s3, bucket, char):
    from urllib.parse import quote

    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}/{quote('bad' + char + 'key')}", body=b"x")
    assert r.status == 400 and code_of(r.body) == "InvalidArgument"
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}?list-type=2&prefix={quote(char)}")
    assert r.status == 400 and code_of(r.body) == "InvalidArgument"
    assert s3.list_objects_v2(Bucket=bucket, Prefix=char).get("KeyCount") == 0  # boto3 asks for encoding-type=url: fine


def test_entity_expansion_and_external_entities_are_never_parsed(server, tenants, s3, bucket):
    s3.put_object(Bucket=bucket, Key="a", Body=b"x")
    bomb = (b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
            b"<Delete><Object><Key>&b;</Key></Object></Delete>")
    xxe = b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><Delete><Object><Key>&x;</Key></Object></Delete>'
    for body in (bomb, xxe):
        r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?delete", headers=md5_header(body), body=body)
        assert r.status == 400 and code_of(r.body) == "MalformedXML" and b"root:" not in r.body
    assert s3.get_object(Bucket=bucket, Key="a")["Body"].read() == b"x"
