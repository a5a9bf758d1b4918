"""Node-to-node authentication (protocol.cluster_auth): signed calls and grants, pure."""

from __future__ import annotations

import pytest

from protocol.cluster import Heartbeat, NodeInfo
from protocol.cluster_auth import CallVerifier, PeerGrant, sign_call
from protocol.errors import S3Error

KEY = b"k" * 40


def test_a_signed_call_verifies_once_and_any_change_is_refused():
    v = CallVerifier(KEY, window_s=30)
    fields = sign_call(KEY, "a", "peer-lookup", {"bucket": "x"}, b"body", now=1000.0)
    assert v.verify("peer-lookup", fields, b"body", now=1001.0) == "a"
    with pytest.raises(S3Error, match="replayed"):
        v.verify("peer-lookup", fields, b"body", now=1001.0)
    for op, f, body in (("peer-fetch", fields, b"body"), ("peer-lookup", {**fields, "bucket": "y"}, b"body"),
                        ("peer-lookup", fields, b"other"), ("peer-lookup", {**fields, "node": "b"}, b"body")):
        with pytest.raises(S3Error, match="signature"):
            CallVerifier(KEY).verify(op, f, body, now=1000.0)
    with pytest.raises(S3Error, match="timestamp"):
        CallVerifier(KEY, window_s=30).verify("peer-lookup", fields, b"body", now=1031.0)
    with pytest.raises(S3Error, match="no cluster signature"):
        CallVerifier(KEY).verify("peer-lookup", {"bucket": "x"}, b"body")
    with pytest.raises(S3Error, match="signature"):
        CallVerifier(b"other" * 8).verify("peer-lookup", sign_call(KEY, "a", "peer-lookup", {}, b""), b"")


def test_a_grant_binds_the_exact_keys_its_key_and_its_lifetime():
    keys = ["k1", "k2", "k3"]
    token = PeerGrant.issue(KEY, tenant="alice", bucket="b", bucket_id="inc-1", keys=keys, request_id="r", issuer="a", ttl_s=10)
    g = PeerGrant.verify(token, KEY, keys)
    assert (g.tenant, g.bucket, g.bucket_id, g.count, g.issuer) == ("alice", "b", "inc-1", 3, "a")
    for other in (keys[:2], keys + ["k4"], ["k1", "k3", "k2"]):
        with pytest.raises(S3Error, match="keys"):
            PeerGrant.verify(token, KEY, other)
    with pytest.raises(S3Error, match="signature"):
        PeerGrant.verify(token, b"x" * 40, keys)
    payload, mac = token.split(".")
    with pytest.raises(S3Error, match="signature"):
        PeerGrant.verify(payload[:-2] + "AA." + mac, KEY, keys)
    with pytest.raises(S3Error, match="expired"):
        PeerGrant.verify(token, KEY, keys, now=g.expires + 1)
    with pytest.raises(S3Error, match="no grant"):
        PeerGrant.verify(None, KEY, keys)


def test_heartbeat_records_round_trip_and_refuse_bad_fields():
    beat = Heartbeat(NodeInfo("gpu-1", "10.0.0.1:9500", zone="z", rack="r", host="h"), seq=7, sent_at=1.5, interval_s=2.0)
    assert Heartbeat.decode(beat.encode()) == beat
    for bad in (b"not json", b'{"node": {"node_id": "bad id!", "address": "h:1"}, "seq": 1, "sent_at": 0, "interval_s": 1}',
                b'{"node": {"node_id": "n", "address": "nohostport"}, "seq": 1, "sent_at": 0, "interval_s": 1}',
                b'{"node": {"node_id": "n", "address": "h:1"}, "seq": "1", "sent_at": 0, "interval_s": 1}'):
        with pytest.raises(S3Error):
            Heartbeat.decode(bad)
