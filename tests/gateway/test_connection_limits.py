"""Slow or silent clients cannot hold the gateway's connections (security audit, defect 6): headers must
arrive in time, a body may not fall silent, connections beyond the cap are refused, and well-behaved
clients are served throughout."""

from __future__ import annotations

import resource
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


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A gateway capped at MAX_CONNECTIONS whose idle connections stay open (30 s), so held slots stay held."""
    root = tmp_path_factory.mktemp("capped")
    tenant = make_tenants("t")[0]
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[gateway]\nheader_timeout_s = 30\nmax_connections = {MAX_CONNECTIONS}\n'
        f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n'))
    proc = ServerProcess(config).start()
    s3 = boto_client(proc.endpoint, tenant)
    s3.create_bucket(Bucket="capped")
    s3.close()  # its keep-alive connection would hold a slot
    yield proc, tenant
    proc.stop()


def served(sock: socket.socket) -> None:
    """One keep-alive request answered on ``sock``: the server has accepted it and holds its slot."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    f = sock.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    f.read(length)


def hold_and_probe(endpoint: str, n: int) -> tuple[list[socket.socket], bytes]:
    """``n`` connections, each shown accepted by an answered request, then what one more gets until closed."""
    held = []
    for _ in range(n):
        held.append(connect(endpoint))
        served(held[-1])
    extra = connect(endpoint)
    try:
        return held, closed_by_server(extra)
    finally:
        extra.close()


def test_connections_beyond_the_cap_are_refused_with_503_and_service_resumes(capped):
    proc, tenant = capped
    held, answer = hold_and_probe(proc.endpoint, MAX_CONNECTIONS)  # all MAX_CONNECTIONS served: the cap is not lower
    try:
        assert answer.startswith(b"HTTP/1.1 503") and b"ServiceUnavailable" in answer
    finally:
        for s in held:
            s.close()
    s3 = boto_client(proc.endpoint, tenant)
    deadline = time.monotonic() + 15
    while True:  # bounded polling: the held slots are freed as the server notices the closed sockets
        try:
            s3.put_object(Bucket="capped", Key="after-cap", Body=b"ok")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert s3.get_object(Bucket="capped", Key="after-cap")["Body"].read() == b"ok"


def test_the_cap_is_at_most_half_the_fd_limit(tmp_path):
    """max_connections 4096 under a file-descriptor limit of 64: the gateway serves 32 connections and refuses the 33rd."""
    fd_limit = 64

    def lower_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    tenant = make_tenants("t")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[gateway]\nheader_timeout_s = 30\nmax_connections = 4096\n\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n'))
    proc = ServerProcess(config, preexec_fn=lower_fd_limit).start()
    try:
        held, answer = hold_and_probe(proc.endpoint, fd_limit // 2)
        for s in held:
            s.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"ServiceUnavailable" in answer, answer[:200]
    finally:
        proc.stop()
