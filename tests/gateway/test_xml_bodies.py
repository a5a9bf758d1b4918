"""Every XML request body is parsed without DTDs or entities (README, "Reliability and security").

Each operation that reads an XML document gets one that would change something if its DTD were
honoured (an entity naming the key, tag or part, an external entity, a DTD alone): each is a
400 MalformedXML and nothing changes. The same documents without the DTD are served, so the
refusal is the DTD's. And no module of the gateway parses XML other than through the one parser.
"""

from __future__ import annotations

import base64
import hashlib
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rawhttp import signed
from support import REPO

DTDS = {
    "internal entity": '<!DOCTYPE d [<!ENTITY e "{value}">]>',
    "external entity": '<!DOCTYPE d [<!ENTITY e SYSTEM "file:///etc/hostname">]>',
    "dtd alone": '<!DOCTYPE d [<!ELEMENT d ANY>]>',
}


def code_of(body: bytes) -> str:
    return ET.fromstring(body).findtext("Code") or ""


def md5(body: bytes) -> dict[str, str]:
    return {"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()}


def document(kind: str | None, template: str, value: str) -> bytes:
    """``template`` with ``{v}`` the value itself (no DTD) or the entity ``&e;`` standing for it."""
    if kind is None:
        return ('<?xml version="1.0"?>' + template.format(v=value)).encode()
    return ('<?xml version="1.0"?>' + DTDS[kind].format(value=value) + template.format(v="&e;" if "entity" in kind else value)).encode()


@pytest.fixture
def obj(s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    return bucket


@pytest.mark.parametrize("kind", sorted(DTDS))
def test_put_object_tagging(server, tenants, s3, obj, kind):
    template = "<Tagging><TagSet><Tag><Key>t</Key><Value>{v}</Value></Tag></TagSet></Tagging>"
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{obj}/k?tagging", body=document(kind, template, "set"))
    assert r.status == 400 and code_of(r.body) == "MalformedXML", r.body
    assert s3.get_object_tagging(Bucket=obj, Key="k")["TagSet"] == []
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{obj}/k?tagging", body=document(None, template, "set"))
    assert r.status == 200 and s3.get_object_tagging(Bucket=obj, Key="k")["TagSet"] == [{"Key": "t", "Value": "set"}]


@pytest.mark.parametrize("kind", sorted(DTDS))
def test_put_bucket_tagging(server, tenants, s3, bucket, kind):
    template = "<Tagging><TagSet><Tag><Key>t</Key><Value>{v}</Value></Tag></TagSet></Tagging>"
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}?tagging", body=document(kind, template, "set"))
    assert r.status == 400 and code_of(r.body) == "MalformedXML", r.body
    r = signed(server.endpoint, tenants["alice"], "GET", f"/{bucket}?tagging")
    assert b"<Value>set</Value>" not in r.body
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{bucket}?tagging", body=document(None, template, "set"))
    assert r.status in (200, 204) and s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == [{"Key": "t", "Value": "set"}]


@pytest.mark.parametrize("kind", sorted(DTDS))
def test_delete_objects(server, tenants, s3, obj, kind):
    template = "<Delete><Object><Key>{v}</Key></Object></Delete>"
    body = document(kind, template, "k")
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{obj}?delete", headers=md5(body), body=body)
    assert r.status == 400 and code_of(r.body) == "MalformedXML", r.body
    assert s3.get_object(Bucket=obj, Key="k")["Body"].read() == b"x"
    body = document(None, template, "k")
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{obj}?delete", headers=md5(body), body=body)
    assert r.status == 200 and b"<Deleted><Key>k</Key>" in r.body


@pytest.mark.parametrize("kind", sorted(DTDS))
def test_complete_multipart_upload(server, tenants, s3, bucket, kind):
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=b"part")["ETag"]
    template = "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{v}</ETag></Part></CompleteMultipartUpload>"
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}/mp?uploadId={upload}", body=document(kind, template, etag.replace('"', "")))
    assert r.status == 400 and code_of(r.body) == "MalformedXML", r.body
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="mp")
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}/mp?uploadId={upload}", body=document(None, template, etag.replace('"', "")))
    assert r.status == 200 and s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"part"


@pytest.mark.parametrize("kind", sorted(DTDS))
def test_create_bucket_configuration(server, tenants, s3, kind):
    name = f"xml-{hashlib.sha1(kind.encode()).hexdigest()[:10]}"
    template = "<CreateBucketConfiguration><LocationConstraint>{v}</LocationConstraint></CreateBucketConfiguration>"
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{name}", body=document(kind, template, "us-east-1"))
    assert r.status == 400 and code_of(r.body) == "MalformedXML", r.body
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    r = signed(server.endpoint, tenants["alice"], "PUT", f"/{name}", body=document(None, template, "us-east-1"))
    assert r.status == 200, r.body
    s3.delete_bucket(Bucket=name)


def test_the_gateway_parses_xml_only_through_its_defused_parser():
    """Any other parser (ElementTree, minidom, sax, lxml) in the gateway would bypass the DTD refusal."""
    parser = REPO / "gateway" / "s3api" / "xml.py"
    pattern = re.compile(r"\b(fromstring|XMLParser|iterparse|parseString|minidom|xml\.sax|lxml|expat|ET\.parse|XML\()")
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in sorted(Path(REPO, "gateway").rglob("*.py")) if p != parser
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
    assert "forbid_dtd=True" in parser.read_text() and re.search(r"\bdefused\.fromstring\(", parser.read_text())
