"""PutObjectAcl / PutBucketAcl with an AccessControlPolicy body: accepted where it is a canned ACL's grant list
(what s3cmd setacl and ACL-preserving cp/mv send: GetObjectAcl's answer, edited), 501 naming why otherwise."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError

from gateway.s3api.access import ALL_USERS, AUTHENTICATED_USERS, policy_acl
from protocol.errors import ErrorCode, S3Error

XSI = 'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"'


def policy(owner: str, *grants: tuple[str, str]) -> bytes:
    """An AccessControlPolicy as s3cmd writes one (namespace, xsi:type attributes, DisplayName)."""
    rows = []
    for who, perm in grants:
        grantee = (f'<Grantee {XSI} xsi:type="Group"><URI>{who}</URI></Grantee>' if who.startswith("http") else
                   f'<Grantee {XSI} xsi:type="CanonicalUser"><ID>{who}</ID><DisplayName>{who}</DisplayName></Grantee>')
        rows.append(f"<Grant>{grantee}<Permission>{perm}</Permission></Grant>")
    return (f'<AccessControlPolicy xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Owner><ID>{owner}</ID></Owner>'
            f'<AccessControlList>{"".join(rows)}</AccessControlList></AccessControlPolicy>').encode()


@pytest.mark.parametrize("grants,acl", [
    ([("o", "FULL_CONTROL")], "private"),
    ([(ALL_USERS, "READ"), ("o", "FULL_CONTROL")], "public-read"),  # any order
    ([("o", "FULL_CONTROL"), (ALL_USERS, "READ"), (ALL_USERS, "WRITE"), (ALL_USERS, "READ")], "public-read-write"),
    ([("o", "FULL_CONTROL"), (AUTHENTICATED_USERS, "READ")], "authenticated-read"),
])
def test_a_canned_acls_grant_list_is_that_acl(grants, acl):
    assert policy_acl(policy("o", *grants), "o") == acl


@pytest.mark.parametrize("grants,why", [
    ([("o", "FULL_CONTROL"), ("bob", "READ")], "grants READ to 'bob'"),
    ([("o", "FULL_CONTROL"), (ALL_USERS, "READ_ACP")], f"grants READ_ACP to '{ALL_USERS}'"),
    ([("o", "READ")], "lacks the owner's FULL_CONTROL"),
    ([("o", "FULL_CONTROL"), (ALL_USERS, "READ"), (AUTHENTICATED_USERS, "READ")], "combine several canned ACLs"),
])
def test_other_grant_lists_are_501_naming_why(grants, why):
    with pytest.raises(S3Error) as e:
        policy_acl(policy("o", *grants), "o")
    assert e.value.code is ErrorCode.NotImplemented and why in e.value.message


def test_another_owner_is_refused():
    with pytest.raises(S3Error) as e:
        policy_acl(policy("mallory", ("mallory", "FULL_CONTROL")), "o")
    assert e.value.code is ErrorCode.NotImplemented and "'mallory'" in e.value.message


def anonymous_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_get_edit_put_round_trip_makes_an_object_public_and_private_again(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"data")
    acl = s3.get_object_acl(Bucket=bucket, Key="k")
    public = {"Owner": acl["Owner"], "Grants": acl["Grants"] + [{"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "READ"}]}
    s3.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy=public)  # what s3cmd setacl --acl-public does
    assert anonymous_status(f"{server.endpoint}/{bucket}/k") == 200
    s3.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy={"Owner": acl["Owner"], "Grants": acl["Grants"]})
    assert anonymous_status(f"{server.endpoint}/{bucket}/k") == 403
    bob = {"Owner": acl["Owner"], "Grants": acl["Grants"] + [{"Grantee": {"Type": "CanonicalUser", "ID": "bob"}, "Permission": "READ"}]}
    with pytest.raises(ClientError) as e:
        s3.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy=bob)
    assert e.value.response["Error"]["Code"] == "NotImplemented" and "'bob'" in e.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as e:
        s3.put_object_acl(Bucket=bucket, Key="missing", AccessControlPolicy=public)
    assert e.value.response["Error"]["Code"] == "NoSuchKey"


def test_a_bucket_acl_from_a_policy_body(s3, bucket):
    acl = s3.get_bucket_acl(Bucket=bucket)
    s3.put_bucket_acl(Bucket=bucket, AccessControlPolicy={
        "Owner": acl["Owner"], "Grants": acl["Grants"] + [{"Grantee": {"Type": "Group", "URI": AUTHENTICATED_USERS}, "Permission": "READ"}]})
    assert [(g["Grantee"].get("URI"), g["Permission"]) for g in s3.get_bucket_acl(Bucket=bucket)["Grants"]] == [
        (None, "FULL_CONTROL"), (AUTHENTICATED_USERS, "READ")]
