"""``bench peers`` skips a peer that cannot run with the reason, and leaves no process behind."""

from __future__ import annotations

import shutil

import pytest

from bench import peer_servers
from bench.peer_servers import Mooncake, PeerUnavailable, Redis


def test_a_peer_without_its_binary_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(peer_servers.shutil, "which", lambda *a, **k: None)
    redis = Redis()
    with pytest.raises(PeerUnavailable, match="redis-server"):
        redis.start()
    monkeypatch.setattr(peer_servers, "mooncake_binary", lambda name: None)
    mooncake = Mooncake()
    with pytest.raises(PeerUnavailable, match="mooncake_master"):
        mooncake.start(segment_bytes=1 << 20)
    assert not redis.root.exists() and not mooncake.root.exists()  # nothing left behind


def test_a_peer_that_exits_at_start_is_unavailable_with_its_log(monkeypatch, tmp_path):
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'no such option' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(peer_servers.shutil, "which", lambda *a, **k: str(fake))
    redis = Redis()
    with pytest.raises(PeerUnavailable, match=r"redis-server did not start \(exit 3\): no such option"):
        redis.start()
    assert not redis.root.exists()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (make peers)")
def test_redis_starts_answers_and_stops():
    import redis

    server = Redis().start()
    try:
        r = redis.Redis(host="127.0.0.1", port=server.port)
        assert r.set("k", b"v") and r.get("k") == b"v"
        r.close()
    finally:
        server.stop()
    assert all(p.poll() is not None for p in server.procs) and not server.root.exists()
