"""A draining gateway says what it waits for, answers what is on the wire with ``Connection: close``
and starts nothing new on a kept-alive connection (issue 23 item 5)."""

from __future__ import annotations

import http.client
import signal
import socket
import time
from urllib.parse import urlsplit

import pytest
from rawhttp import sign
from support import ServerProcess, boto_client, make_tenants, write_config


def _request_bytes(tenant, endpoint: str, method: str, path: str, body: bytes) -> bytes:
    headers = sign(tenant, method, f"{endpoint}{path}", {"Content-Length": str(len(body))}, body, payload_hash="UNSIGNED-PAYLOAD")
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()


def _wait_for(gateway: ServerProcess, text: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(gateway.output):
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no line with {text!r} in:\n" + "".join(gateway.output))


@pytest.fixture
def gateway(tmp_path):
    tenant = make_tenants("drain")[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra="\n[gateway]\ndrain_timeout_s = 20\n")
    proc = ServerProcess(config, "gateway").start()
    boto_client(proc.endpoint, tenant).create_bucket(Bucket="drain")
    yield proc, tenant, config
    if proc.proc.poll() is None:
        proc.stop()


def test_a_request_in_flight_finishes_with_connection_close_and_the_connection_takes_no_new_upload(gateway):
    proc, tenant, config = gateway
    u = urlsplit(proc.endpoint)
    body = b"x" * 4096
    conn = socket.create_connection((u.hostname, u.port), timeout=20)
    try:
        # An upload on the wire: headers and half its body sent when the drain begins.
        conn.sendall(_request_bytes(tenant, proc.endpoint, "PUT", "/drain/in-flight", body) + body[:2048])
        time.sleep(0.3)  # the gateway has parsed the headers: the request is in flight (it waits for the body)
        proc.proc.send_signal(signal.SIGTERM)
        line = _wait_for(proc, "gateway draining")
        assert "PUT /drain/in-flight" in line and "1 request(s)" in line, line
        conn.sendall(body[2048:])
        f = conn.makefile("rb")
        status = f.readline()
        headers = {}
        while (h := f.readline().strip()):
            k, _, v = h.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        assert status.split()[1] == b"200", status
        assert headers.get("connection", "").lower() == "close", (headers, "".join(proc.output))
        # The client, as a keep-alive client would, sends its next upload on the same connection: not accepted.
        try:
            conn.sendall(_request_bytes(tenant, proc.endpoint, "PUT", "/drain/after", body) + body)
            rest = f.read()
        except OSError:
            rest = b""
        assert b"200 OK" not in rest
    finally:
        conn.close()
    assert proc.proc.wait(timeout=30) == 0
    again = ServerProcess(config, "gateway").start()
    try:
        s3 = boto_client(again.endpoint, tenant)
        assert s3.get_object(Bucket="drain", Key="in-flight")["Body"].read() == body
        assert [o["Key"] for o in s3.list_objects_v2(Bucket="drain").get("Contents", [])] == ["in-flight"]
    finally:
        again.stop()


def test_a_new_request_on_a_kept_alive_connection_during_the_drain_is_503_and_closes(gateway):
    proc, tenant, config = gateway
    u = urlsplit(proc.endpoint)
    hold = socket.create_connection((u.hostname, u.port), timeout=20)  # keeps the drain waiting
    body = b"y" * 1024
    hold.sendall(_request_bytes(tenant, proc.endpoint, "PUT", "/drain/held", body) + body[:10])
    idle = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    try:
        time.sleep(0.3)
        headers = sign(tenant, "GET", f"{proc.endpoint}/drain", {})
        idle.request("GET", "/drain", headers=headers)
        r = idle.getresponse()
        r.read()
        assert r.status == 200 and not r.will_close
        proc.proc.send_signal(signal.SIGTERM)
        _wait_for(proc, "gateway draining")
        try:
            idle.request("PUT", "/drain/new", body=body,
                         headers=sign(tenant, "PUT", f"{proc.endpoint}/drain/new", {"Content-Length": str(len(body))}, body))
            r = idle.getresponse()
            answer = (r.status, r.getheader("Connection"), r.read())
        except (OSError, http.client.HTTPException):
            answer = None  # the connection was closed instead: nothing accepted either
        if answer is not None:
            assert answer[0] == 503 and (answer[1] or "").lower() == "close" and b"ServiceUnavailable" in answer[2], answer
    finally:
        idle.close()
        hold.sendall(body[10:])
        hold.close()
    assert proc.proc.wait(timeout=30) == 0
    again = ServerProcess(config, "gateway").start()
    try:
        keys = [o["Key"] for o in boto_client(again.endpoint, tenant).list_objects_v2(Bucket="drain").get("Contents", [])]
        assert "new" not in keys
    finally:
        again.stop()
