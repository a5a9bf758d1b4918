"""The storage server's sockets as the README's security section describes them: the RPC socket is
private to the service user (0600); the data endpoint disconnects a client that does not send its
request within 10 s and serves one kv-get per connection."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading

import pytest
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from rawhttp import signed
from support import ServerProcess, boto_client, make_tenants, split_serving, write_config

from protocol.data_ticket import HEADER_DIRECT
from protocol.wire import FRAME_SIZE, Descriptor, FrameType, Target, TransportKind, encode_descriptor, unpack_frame

LAYOUT = tiny_layout(16, num_layers=4)
N = 8
REQUEST_TIMEOUT_S = 10  # README: "a client that does not send its request within 10 s is disconnected"


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_rpc_socket_is_0600_under_serve(server):
    assert stat.S_ISSOCK(os.stat(server.rpc_socket).st_mode) and mode(server.rpc_socket) == 0o600


def test_the_rpc_socket_is_0600_for_a_storage_server_alone_whatever_the_umask(tmp_path):
    old = os.umask(0)  # the child inherits it: a socket bound under umask 0 would be 0777
    try:
        with split_serving(tmp_path) as (storage, gateway, tenant):
            assert mode(str(tmp_path / "ss.sock")) == 0o600
            boto_client(gateway.endpoint, tenant).create_bucket(Bucket="still-served")  # and the gateway still reaches it
    finally:
        os.umask(old)


@pytest.fixture(scope="module")
def data_node(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasock")
    alice = make_tenants("alice")[0]
    config = write_config(root / "c.toml", root / "data", [alice],
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\ndata_listen = "127.0.0.1:0"\n')
    proc = ServerProcess(config).start()
    boto_client(proc.endpoint, alice).create_bucket(Bucket="data")
    keys = keys_for(LAYOUT, N, "data")

    async def put():
        async with client(proc, alice, "data") as c:
            await c.put_chunks(keys, make_chunks(LAYOUT, N, seed=9), LAYOUT)

    run(put())
    yield proc, alice, keys
    proc.stop()


def descriptor(keys) -> bytes:
    return encode_descriptor(Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes,
                                        Target(TransportKind.HTTP, length=len(keys) * LAYOUT.chunk_bytes)))


def grant(proc, tenant, body: bytes) -> dict:
    r = signed(proc.endpoint, tenant, "POST", "/data?kv-get", headers={HEADER_DIRECT: "1"}, body=body)
    assert r.status == 200, r.body
    return json.loads(r.body)


def request(ticket: str, body: bytes) -> bytes:
    return json.dumps({"op": "kv-get", "body": len(body), "ticket": ticket}).encode() + b"\n" + body


def connect(endpoint: str) -> socket.socket:
    host, _, port = endpoint.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S * 4)  # bounded: never hangs the suite


def read_transfer(f) -> dict:
    """One kv-get's reply line and frames up to END; the reply."""
    reply = json.loads(f.readline())
    assert reply.get("ok"), reply
    while True:
        frame = unpack_frame(f.read(FRAME_SIZE))
        f.read(frame.length if frame.has_payload else 0)
        if frame.type in (FrameType.END, FrameType.ERROR):
            assert frame.type == FrameType.END
            return reply


def test_a_client_that_does_not_send_its_request_is_disconnected(data_node):
    """Silent, and half a request line: each answered RequestTimeout, then closed (waited for, not timed)."""
    proc, alice, keys = data_node
    endpoint = grant(proc, alice, descriptor(keys))["endpoint"]
    results: dict[str, tuple[dict, bytes]] = {}

    def stall(name: str, first: bytes) -> None:
        with connect(endpoint) as s:
            s.sendall(first)
            f = s.makefile("rb")
            results[name] = (json.loads(f.readline()), f.read())

    threads = [threading.Thread(target=stall, args=a) for a in (("silent", b""), ("trickle", b'{"op": "kv-get", "bo'))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["silent", "trickle"], "a stalled client got no answer"
    for name, (reply, rest) in results.items():
        assert not reply["ok"] and reply["error"]["code"] == "RequestTimeout", (name, reply)
        assert rest == b"", name  # and the connection was closed


def test_one_kv_get_per_connection(data_node):
    """A second ticketed kv-get on the connection that carried one: nothing answers it, the connection
    is closed (end of stream or reset), and it was never served (its ticket still works on a new one).
    (Sent after the first transfer's END: pipelined, the server's close with it unread resets the
    connection, which may drop the end of the first reply in flight.)"""
    proc, alice, keys = data_node
    first, second = descriptor(keys[:4]), descriptor(keys)
    g1, g2 = grant(proc, alice, first), grant(proc, alice, second)
    with connect(g1["endpoint"]) as s:
        s.sendall(request(g1["ticket"], first))
        f = s.makefile("rb")
        assert read_transfer(f)["payload_bytes"] == 4 * LAYOUT.chunk_bytes
        try:
            s.sendall(request(g2["ticket"], second))
            rest = f.read()
        except (ConnectionResetError, BrokenPipeError):
            rest = b""
        assert rest == b""  # closed: nothing answers the second request
    with connect(g2["endpoint"]) as s:
        s.sendall(request(g2["ticket"], second))
        assert read_transfer(s.makefile("rb"))["payload_bytes"] == N * LAYOUT.chunk_bytes


def test_a_refused_request_also_ends_the_connection(data_node):
    proc, alice, keys = data_node
    body = descriptor(keys)
    g = grant(proc, alice, body)
    with connect(g["endpoint"]) as s:
        s.sendall(b"not json\n" + request(g["ticket"], body))
        f = s.makefile("rb")
        reply = json.loads(f.readline())
        assert not reply["ok"] and f.read() == b""
