"""Tags and canned ACLs: parsing what clients send and rendering what S3 answers.

ObjectCache supports S3's canned ACLs (``x-amz-acl``), not grant lists: an owner always holds
FULL_CONTROL, ``public-read`` lets anyone read an object, ``authenticated-read`` any signed
requester. Buckets and objects carry at most 50 and 10 tags.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from multidict import CIMultiDictProxy

from protocol.errors import ErrorCode, S3Error

from . import xml

CANNED_ACLS = ("private", "public-read", "public-read-write", "authenticated-read", "aws-exec-read", "bucket-owner-read",
               "bucket-owner-full-control", "log-delivery-write")
PUBLIC_READ = ("public-read", "public-read-write")
MAX_OBJECT_TAGS, MAX_BUCKET_TAGS = 10, 50
XSI = "http://www.w3.org/2001/XMLSchema-instance"
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTHENTICATED_USERS = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"


def canned_acl(headers: CIMultiDictProxy[str]) -> str:
    value = headers.get("x-amz-acl", "private").strip()
    if value not in CANNED_ACLS:
        raise S3Error(ErrorCode.InvalidArgument, f"x-amz-acl must be one of {', '.join(CANNED_ACLS)}",
                      extra={"ArgumentName": "x-amz-acl", "ArgumentValue": value})
    return value


def may_read(acl: str, owner: str, requester: str | None) -> bool:
    """Whether ``requester`` (None: anonymous) may read something with this canned ACL."""
    return requester == owner or acl in PUBLIC_READ or (acl == "authenticated-read" and requester is not None)


def validated_tags(pairs: list[tuple[str, str]], limit: int) -> dict[str, str]:
    tags: dict[str, str] = {}
    for key, value in pairs:
        if not 1 <= len(key) <= 128 or len(value) > 256 or key.lower().startswith("aws:"):
            raise S3Error(ErrorCode.InvalidTag, f"Tag {key[:40]!r}: keys are 1-128 characters (not 'aws:'), values at most 256.")
        if key in tags:
            raise S3Error(ErrorCode.InvalidTag, f"Cannot provide multiple Tags with the same key {key[:40]!r}.")
        tags[key] = value
    if len(tags) > limit:
        raise S3Error(ErrorCode.InvalidTag, f"At most {limit} tags are allowed; got {len(tags)}.")
    return tags


def tagging_header(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    """``x-amz-tagging: k1=v1&k2=v2`` on PUT, CopyObject and CreateMultipartUpload."""
    raw = headers.get("x-amz-tagging")
    return validated_tags(parse_qsl(raw, keep_blank_values=True), MAX_OBJECT_TAGS) if raw else {}


def parse_tagging(body: bytes, limit: int) -> dict[str, str]:
    doc = xml.parse(body, "Tagging")
    pairs = []
    for tag_set in xml.children(doc, "TagSet"):
        for tag in xml.children(tag_set, "Tag"):
            key, value = xml.child_text(tag, "Key"), xml.child_text(tag, "Value", "")
            if key is None:
                raise S3Error(ErrorCode.MalformedXML, "Every <Tag> needs a <Key>.")
            pairs.append((key, value or ""))
    return validated_tags(pairs, limit)


def tagging_nodes(tags: dict[str, str]) -> list[xml.Node]:
    return [("TagSet", [("Tag", [("Key", k), ("Value", v)]) for k, v in tags.items()])]


def _grant(grantee: xml.Node, permission: str) -> xml.Node:
    return ("Grant", [grantee, ("Permission", permission)])


def acl_nodes(owner: str, acl: str) -> list[xml.Node]:
    """The AccessControlPolicy a canned ACL amounts to."""
    owner_nodes: list[xml.Node] = [("ID", owner), ("DisplayName", owner)]
    grants = [_grant(("Grantee", owner_nodes, {"xmlns:xsi": XSI, "xsi:type": "CanonicalUser"}), "FULL_CONTROL")]

    def group(uri: str, permission: str) -> None:
        grants.append(_grant(("Grantee", [("URI", uri)], {"xmlns:xsi": XSI, "xsi:type": "Group"}), permission))

    if acl in PUBLIC_READ:
        group(ALL_USERS, "READ")
    if acl == "public-read-write":
        group(ALL_USERS, "WRITE")
    if acl == "authenticated-read":
        group(AUTHENTICATED_USERS, "READ")
    return [("Owner", owner_nodes), ("AccessControlList", grants)]


def reject_grant_lists(headers: CIMultiDictProxy[str], body: bytes) -> None:
    """Only canned ACLs are supported: grant headers or an AccessControlPolicy body answer 501."""
    if body.strip() or any(h.lower().startswith("x-amz-grant-") for h in headers):
        raise S3Error(ErrorCode.NotImplemented, "Only canned ACLs (the x-amz-acl header) are supported, not grant lists.")
