"""Slow or silent clients cannot hold the gateway's connections (security audit, defect 6): headers must
arrive in time, a body may not fall silent, connections beyond the cap are refused, and well-behaved
clients are served throughout."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest
from support import ServerProcess, boto_client, make_tenants, write_config

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 24


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    root = tmp_path_factory.mktemp("guarded")
    tenant = make_tenants("t")[0]
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[gateway]\nheader_timeout_s = {HEADER_TIMEOUT_S}\nbody_timeout_s = {BODY_TIMEOUT_S}\nmax_connections = {MAX_CONNECTIONS}\n'
        f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n'))
    proc = ServerProcess(config).start()
    s3 = boto_client(proc.endpoint, tenant)
    s3.create_bucket(Bucket="guarded")
    yield proc, tenant, s3
    proc.stop()


def connect(endpoint: str) -> socket.socket:
    u = urlsplit(endpoint)
    return socket.create_connection((u.hostname, u.port), timeout=20)


def closed_by_server(sock: socket.socket, within_s: float = 15.0) -> bytes:
    """Everything the server sent until it closed the connection (bounded wait)."""
    sock.settimeout(within_s)
    got = b""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not piece:
            return got
        got += piece
    raise AssertionError("the server kept the connection open")


def test_silent_and_trickling_connections_are_closed_while_others_are_served(guarded):
    proc, _, s3 = guarded
    silent = [connect(proc.endpoint) for _ in range(5)]
    trickling = [connect(proc.endpoint) for _ in range(5)]
    for s in trickling:
        s.sendall(b"PUT /guarded/slow HTTP/1.1\r\nHost: x\r\n")  # headers that never end
    s3.put_object(Bucket="guarded", Key="meanwhile", Body=b"served")  # a well-behaved client, meanwhile
    for s in silent + trickling:
        closed_by_server(s)
        s.close()
    assert s3.get_object(Bucket="guarded", Key="meanwhile")["Body"].read() == b"served"


def test_a_body_that_falls_silent_gets_request_timeout_and_nothing_is_stored(guarded):
    proc, tenant, s3 = guarded
    from rawhttp import sign

    headers = sign(tenant, "PUT", f"{proc.endpoint}/guarded/half", {"Content-Length": "1000"}, payload_hash="UNSIGNED-PAYLOAD")
    s = connect(proc.endpoint)
    request = "PUT /guarded/half HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    s.sendall(request.encode() + b"x" * 10)
    answer = closed_by_server(s)
    s.close()
    assert answer.startswith(b"HTTP/1.1 400") and b"RequestTimeout" in answer
    with pytest.raises(Exception):
        s3.head_object(Bucket="guarded", Key="half")


def test_connections_beyond_the_cap_are_refused_with_503_and_service_resumes(guarded):
    proc, _, s3 = guarded
    held = [connect(proc.endpoint) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # let the server accept them all
        extra = connect(proc.endpoint)
        answer = closed_by_server(extra)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"ServiceUnavailable" in answer
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 15
    while True:  # the held slots are freed as the server notices the closed sockets
        try:
            s3.put_object(Bucket="guarded", Key="after-cap", Body=b"ok")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert s3.get_object(Bucket="guarded", Key="after-cap")["Body"].read() == b"ok"
