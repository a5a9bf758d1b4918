"""Local fast-path sessions (pure bookkeeping): one-time tickets, bound to one process, expiring, per tenant."""

from __future__ import annotations

import pytest

from protocol.errors import S3Error
from storage_server.local_sessions import Peer, SessionRegistry

ME, OTHER_PID, OTHER_USER = Peer(100, 1000, 1000), Peer(101, 1000, 1000), Peer(100, 1001, 1000)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def registry(ttl: float = 60.0, cap: int = 4) -> tuple[SessionRegistry, Clock]:
    clock = Clock()
    return SessionRegistry(ttl, cap, clock), clock


def denied(call) -> str:
    with pytest.raises(S3Error) as e:
        call()
    assert e.value.code.name == "AccessDenied"
    return e.value.message


def test_a_session_serves_only_the_process_that_bound_it():
    reg, _ = registry()
    s = reg.bind(reg.offer("alice", "b", "inc1"), ME)
    assert reg.check(s.session_id, s.secret, ME) is s and (s.tenant, s.bucket, s.incarnation) == ("alice", "b", "inc1")
    assert "another process" in denied(lambda: reg.check(s.session_id, s.secret, OTHER_PID))
    assert "another process" in denied(lambda: reg.check(s.session_id, s.secret, OTHER_USER))
    assert "secret" in denied(lambda: reg.check(s.session_id, bytes(32), ME))


def test_a_session_expires_and_a_ticket_is_good_once_and_briefly():
    reg, clock = registry(ttl=60.0)
    ticket = reg.offer("alice", "b", "inc1")
    s = reg.bind(ticket, ME)
    assert "unknown, used or expired" in denied(lambda: reg.bind(ticket, ME))
    clock.now = 59.0
    reg.check(s.session_id, s.secret, ME)
    clock.now = 60.0
    assert "expired" in denied(lambda: reg.check(s.session_id, s.secret, ME))
    late = reg.offer("alice", "b", "inc1")
    clock.now += 31.0
    denied(lambda: reg.bind(late, ME))


def test_sessions_belong_to_the_tenant_the_gateway_vouched_for_and_are_capped_per_tenant():
    reg, clock = registry(cap=2)
    bob = reg.bind(reg.offer("bob", "bobs", "i"), ME)
    alice = []
    for _ in range(3):
        clock.now += 1
        alice.append(reg.bind(reg.offer("alice", "a", "i"), ME))
    denied(lambda: reg.check(alice[0].session_id, alice[0].secret, ME))  # the oldest of alice's went at her cap ...
    assert reg.check(bob.session_id, bob.secret, ME).tenant == "bob"  # ... never another tenant's
    assert [reg.check(s.session_id, s.secret, ME).tenant for s in alice[1:]] == ["alice", "alice"]
    denied(lambda: reg.check(bob.session_id, alice[1].secret, ME))  # one tenant's secret opens no other session


def test_no_sessions_when_the_fast_path_is_off():
    reg, _ = registry(cap=0)
    with pytest.raises(S3Error) as e:
        reg.offer("alice", "b", "i")
    assert e.value.code.name == "NotImplemented" and "max_sessions_per_tenant" in e.value.message
