"""The storage server's RPC answers malformed requests with an error reply instead of dropping the connection."""

from __future__ import annotations

import json
import socket

from protocol.rpc import MAX_REQUEST_LINE


def exchange(path: str, *lines: bytes) -> list[dict]:
    """Send raw request lines on one connection; one parsed reply per line."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(path)
        replies = []
        f = s.makefile("rb")
        for line in lines:
            s.sendall(line)
            replies.append(json.loads(f.readline()))
        return replies


def test_malformed_lines_get_error_replies_and_the_connection_keeps_serving(server):
    replies = exchange(
        server.rpc_socket,
        b"this is not json\n",
        b"[1, 2, 3]\n",
        b'{"op": "no-such-op"}\n',
        b'{"op": "ping", "body": -1}\n',
        b'{"op": "kv-lookup", "body": 0}\n',  # no bucket field
        b'{"op": "ping"}\n',
    )
    for reply in replies[:5]:
        assert reply["ok"] is False and reply["error"]["code"] == "InvalidRequest", reply
    assert "no-such-op" in replies[2]["error"]["message"] and "bucket" in replies[4]["error"]["message"]
    assert replies[5] == {"ok": True, "pong": True}


def test_an_overlong_request_line_is_answered_then_closed(server):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(server.rpc_socket)
        s.sendall(b"x" * (MAX_REQUEST_LINE + 10) + b"\n")
        reply = json.loads(s.makefile("rb").readline())
    assert reply["ok"] is False and reply["error"]["code"] == "InvalidRequest" and "longer than" in reply["error"]["message"]
