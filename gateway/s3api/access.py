"""Tags and canned ACLs: parsing what clients send and rendering what S3 answers.

ObjectCache supports S3's canned ACLs (``x-amz-acl``), not grant lists: an owner always holds
FULL_CONTROL, ``public-read`` lets anyone read an object, ``authenticated-read`` any signed
requester. An AccessControlPolicy body is accepted where its grants are exactly a canned ACL's
(what GetObjectAcl returned, edited by s3cmd setacl, or copied by ACL-preserving cp/mv).
Buckets and objects carry at most 50 and 10 tags.
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


# Canned ACLs whose grants differ (the others grant what ``private`` grants), in the order a policy is matched.
DISTINCT_ACLS = ("private", "public-read", "public-read-write", "authenticated-read")


def canned_grants(acl: str, owner: str) -> list[tuple[str, str]]:
    """A canned ACL's grants as (grantee, permission): the owner's id first, then group URIs."""
    grants = [(owner, "FULL_CONTROL")]
    if acl in PUBLIC_READ:
        grants.append((ALL_USERS, "READ"))
    if acl == "public-read-write":
        grants.append((ALL_USERS, "WRITE"))
    if acl == "authenticated-read":
        grants.append((AUTHENTICATED_USERS, "READ"))
    return grants


def acl_nodes(owner: str, acl: str) -> list[xml.Node]:
    """The AccessControlPolicy a canned ACL amounts to."""
    owner_nodes: list[xml.Node] = [("ID", owner), ("DisplayName", owner)]

    def grantee(who: str) -> xml.Node:
        if who == owner:
            return ("Grantee", owner_nodes, {"xmlns:xsi": XSI, "xsi:type": "CanonicalUser"})
        return ("Grantee", [("URI", who)], {"xmlns:xsi": XSI, "xsi:type": "Group"})

    grants: list[xml.Node] = [("Grant", [grantee(who), ("Permission", perm)]) for who, perm in canned_grants(acl, owner)]
    return [("Owner", owner_nodes), ("AccessControlList", grants)]


def _policy_grants(body: bytes, owner: str) -> set[tuple[str, str]]:
    """An AccessControlPolicy's grants as (grantee, permission); 501 for what no canned ACL could grant."""
    doc = xml.parse(body, "AccessControlPolicy")
    for el in xml.children(doc, "Owner"):
        named = (xml.child_text(el, "ID") or "").strip()
        if named and named != owner:
            raise S3Error(ErrorCode.NotImplemented, f"The policy names owner {named!r}; the owner is {owner!r} and cannot be changed.")
    grants: set[tuple[str, str]] = set()
    for acl_list in xml.children(doc, "AccessControlList"):
        for grant in xml.children(acl_list, "Grant"):
            grantees, permission = xml.children(grant, "Grantee"), (xml.child_text(grant, "Permission") or "").strip()
            if not grantees or not permission:
                raise S3Error(ErrorCode.MalformedXML, "Every <Grant> needs a <Grantee> and a <Permission>.")
            who = xml.child_text(grantees[0], "URI") or xml.child_text(grantees[0], "ID")
            if not who:
                raise S3Error(ErrorCode.NotImplemented, "Grants to e-mail addresses are not supported; only grant lists equal to a canned ACL are.")
            grants.add((who.strip(), permission))
    return grants


def policy_acl(body: bytes, owner: str) -> str:
    """The canned ACL an AccessControlPolicy body is equivalent to (the grants S3 returns for it, in any order);
    501 naming why for any other grant list."""
    grants = _policy_grants(body, owner)
    for acl in DISTINCT_ACLS:
        if grants == set(canned_grants(acl, owner)):
            return acl
    allowed = {g for acl in DISTINCT_ACLS for g in canned_grants(acl, owner)}
    extra = sorted(grants - allowed)
    why = ("it lacks the owner's FULL_CONTROL" if (owner, "FULL_CONTROL") not in grants else
           f"it grants {extra[0][1]} to {extra[0][0]!r}" if extra else "its grants combine several canned ACLs")
    raise S3Error(ErrorCode.NotImplemented, f"Only grant lists equal to a canned ACL ({', '.join(DISTINCT_ACLS)}) are supported: {why}.")


def requested_acl(headers: CIMultiDictProxy[str], body: bytes, owner: str) -> str:
    """The canned ACL a Put*Acl request sets: ``x-amz-acl``, or an equivalent AccessControlPolicy body. Grant headers are 501."""
    if any(h.lower().startswith("x-amz-grant-") for h in headers):
        raise S3Error(ErrorCode.NotImplemented, "Grant headers (x-amz-grant-*) are not supported; use a canned ACL (x-amz-acl).")
    if not body.strip():
        return canned_acl(headers)
    if "x-amz-acl" in headers:
        raise S3Error(ErrorCode.InvalidRequest, "Specify a canned ACL (x-amz-acl) or an AccessControlPolicy body, not both.")
    return policy_acl(body, owner)
