"""Bucket ownership on the s3 backend: two nodes over one upstream (moto's server), tenants alice and bob.

* An upstream bucket without ObjectCache's record is nobody's to claim unless the operator
  adopted it (``store.s3.adopt_buckets``).
* Ownership never comes from a stale record: a bucket alice deleted and bob recreated
  through node A is bob's on node B at once, even where B read alice's record just before.
* An anonymous ``/ready`` costs O(1) upstream requests, however many buckets there are.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from support import ServerProcess, TenantKeys, boto_client, make_tenants
from upstream import KEYS, MotoServer, s3_backend_config

ADOPTED = "adopted-by-alice"


def node_config(root: Path, name: str, moto: MotoServer, tenants: list[TenantKeys], extra_s3: str = "") -> Path:
    """A node whose housekeeping stays out of the way: its hourly upload sweep (every bucket listed, each bucket's
    record read for lifecycle rules) is not what these tests count, and on a loaded machine the first one, 10 s
    after the start, once landed inside the /ready test's window."""
    path = s3_backend_config(root, moto, tenants, name, s3_extra=extra_s3)
    path.write_text(path.read_text().replace("[storage_server]\n", "[storage_server]\nhousekeeping_s = 3600\n", 1))
    return path


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    moto = MotoServer(root / "moto.log").start()
    people = make_tenants("alice", "bob")
    adopt = f'adopt_buckets = ["{ADOPTED}:alice"]\n'
    nodes = [ServerProcess(node_config(root, name, moto, people, adopt)).start() for name in ("a", "b")]
    yield moto, nodes[0], nodes[1], {t.name: t for t in people}
    for n in nodes:
        n.stop()
    moto.stop()


def _upstream(moto: MotoServer):
    """A client of the upstream itself, as some other application using the same store would have."""
    return boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id=KEYS[0], aws_secret_access_key=KEYS[1], region_name="us-east-1")


def _code(e: pytest.ExceptionInfo) -> str:
    return e.value.response["Error"]["Code"]


def test_an_upstream_bucket_without_a_record_is_not_claimed_by_create_bucket(tier):
    moto, a, b, people = tier
    other_app = _upstream(moto)
    other_app.create_bucket(Bucket="payroll")
    other_app.put_object(Bucket="payroll", Key="salaries.csv", Body=b"alice,1\nbob,2\n")
    for node in (a, b):
        bob = boto_client(node.endpoint, people["bob"])
        with pytest.raises(ClientError) as e:
            bob.create_bucket(Bucket="payroll")
        assert _code(e) == "BucketAlreadyExists"
        with pytest.raises(ClientError) as e:
            bob.get_object(Bucket="payroll", Key="salaries.csv")
        assert _code(e) == "NoSuchBucket"
        assert "payroll" not in [x["Name"] for x in bob.list_buckets()["Buckets"]]
    assert [o["Key"] for o in other_app.list_objects_v2(Bucket="payroll")["Contents"]] == ["salaries.csv"]  # no record written


def test_an_adopted_upstream_bucket_is_claimed_only_by_the_tenant_it_was_adopted_for(tier):
    moto, a, b, people = tier
    other_app = _upstream(moto)
    other_app.create_bucket(Bucket=ADOPTED)
    other_app.put_object(Bucket=ADOPTED, Key="old.txt", Body=b"migrated data")
    with pytest.raises(ClientError) as e:
        boto_client(a.endpoint, people["bob"]).create_bucket(Bucket=ADOPTED)
    assert _code(e) == "BucketAlreadyExists"
    alice_a, alice_b = boto_client(a.endpoint, people["alice"]), boto_client(b.endpoint, people["alice"])
    alice_a.create_bucket(Bucket=ADOPTED)
    assert alice_b.get_object(Bucket=ADOPTED, Key="old.txt")["Body"].read() == b"migrated data"
    alice_b.create_bucket(Bucket=ADOPTED)  # her own bucket again: 200 in us-east-1, as S3 answers
    with pytest.raises(ClientError) as e:
        boto_client(b.endpoint, people["bob"]).get_object(Bucket=ADOPTED, Key="old.txt")
    assert _code(e) == "AccessDenied"


def test_new_buckets_are_still_created_and_recreated_through_any_node(tier):
    _, a, b, people = tier
    alice_a, bob_b = boto_client(a.endpoint, people["alice"]), boto_client(b.endpoint, people["bob"])
    alice_a.create_bucket(Bucket="fresh")
    alice_a.create_bucket(Bucket="fresh")  # her own bucket again: 200 in us-east-1, as S3 answers
    with pytest.raises(ClientError) as e:
        bob_b.create_bucket(Bucket="fresh")
    assert _code(e) == "BucketAlreadyExists"
    alice_a.delete_bucket(Bucket="fresh")
    bob_b.create_bucket(Bucket="fresh")
    bob_b.put_object(Bucket="fresh", Key="k", Body=b"bob")
    assert bob_b.get_object(Bucket="fresh", Key="k")["Body"].read() == b"bob"


def test_a_bucket_recreated_by_another_tenant_is_never_served_from_the_old_record(tier):
    _, a, b, people = tier
    alice_a, alice_b = boto_client(a.endpoint, people["alice"]), boto_client(b.endpoint, people["alice"])
    bob_a = boto_client(a.endpoint, people["bob"])
    alice_a.create_bucket(Bucket="handed-over")
    alice_b.put_object(Bucket="handed-over", Key="mine", Body=b"alice")  # node B has read alice's record
    alice_a.delete_object(Bucket="handed-over", Key="mine")
    alice_a.delete_bucket(Bucket="handed-over")
    bob_a.create_bucket(Bucket="handed-over")
    bob_a.put_object(Bucket="handed-over", Key="secret", Body=b"bob's")
    for attempt in (lambda: alice_b.list_objects_v2(Bucket="handed-over"),
                    lambda: alice_b.get_object(Bucket="handed-over", Key="secret"),
                    lambda: alice_b.put_object(Bucket="handed-over", Key="planted", Body=b"x")):
        with pytest.raises(ClientError) as e:
            attempt()
        assert _code(e) == "AccessDenied"
    assert [o["Key"] for o in bob_a.list_objects_v2(Bucket="handed-over")["Contents"]] == ["secret"]


def test_an_anonymous_ready_costs_a_constant_number_of_upstream_requests(tier):
    moto, a, b, people = tier
    alice_a = boto_client(a.endpoint, people["alice"])
    for i in range(12):
        alice_a.create_bucket(Bucket=f"many-{i:02d}")
    before = len(moto.requests())
    with urllib.request.urlopen(f"{b.endpoint}/ready", timeout=10) as resp:
        assert resp.status == 200
    assert len(moto.requests()[before:]) <= 1
