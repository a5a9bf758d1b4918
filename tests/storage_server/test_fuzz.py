"""A bounded fuzz run against the real storage server: whatever arrives on its RPC socket, it stays up and
answers with an error from the catalogue (descriptors, kv-put / kv-lookup bodies, the envelope itself)."""

from __future__ import annotations

import json
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvsupport import rpc

from protocol.errors import ErrorCode
from protocol.rpc import Op
from protocol.wire import FRAME_SIZE, Descriptor, Target, TransportKind, encode_descriptor, encode_keys, encode_put_batch, unpack_frame

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CODES = set(ErrorCode.__members__)


@pytest.fixture(scope="module")
def daemon_pid(server) -> int:
    return rpc(server.rpc_socket, "status")["pid"]


@pytest.fixture(scope="module")
def fuzz_bucket(s3, daemon_pid) -> str:
    s3.create_bucket(Bucket="kv-fuzz")
    return "kv-fuzz"


def call(path: str, line: bytes, body: bytes = b"") -> dict:
    """One request on a fresh connection; the reply line, after draining any frames that follow it."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(line + body)
        f = s.makefile("rb")
        reply = json.loads(f.readline())
        if reply.get("ok") and "num_layers" in reply:  # an accepted kv-get: frames until END or ERROR
            while head := f.read(FRAME_SIZE):
                frame = unpack_frame(head)
                f.read(frame.length if frame.has_payload else 0)
                if frame.type.name in ("END", "ERROR"):
                    break
        return reply


def assert_same_daemon(server, daemon_pid: int) -> None:
    """Checked inside every fuzz test (not by a test that would have to run last: under xdist it may not,
    and on another worker it would compare a fresh pid with itself): nothing crashed or restarted the daemon."""
    assert rpc(server.rpc_socket, "status")["pid"] == daemon_pid, "the storage server was restarted during this test"


def assert_clean(reply: dict) -> None:
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
    if not reply["ok"]:
        assert reply["error"]["code"] in CODES and reply["error"]["message"]
        assert reply["error"]["code"] != "InternalError", reply


def envelope(op: str, body: bytes, bucket: str, **fields) -> bytes:
    return json.dumps({"op": op, "body": len(body), "tenant": "alice", "bucket": bucket, **fields}).encode() + b"\n"


def valid_descriptor(n: int) -> bytes:
    return encode_descriptor(Descriptor([f"fuzz/{i}" for i in range(n)], 4, 16, 32, Target(TransportKind.HTTP, length=n * 128)))


def mutated(base: bytes):
    """The base bytes truncated, with bytes overwritten, or with garbage appended."""
    return st.one_of(
        st.integers(0, len(base)).map(lambda i: base[:i]),
        st.lists(st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255)), min_size=1, max_size=8).map(
            lambda edits: bytes(b if i not in dict(edits) else dict(edits)[i] for i, b in enumerate(base))),
        st.binary(max_size=64).map(lambda tail: base + tail),
    )


@FUZZ
@given(body=st.one_of(st.binary(max_size=512), mutated(valid_descriptor(3))))
def test_descriptors(server, daemon_pid, fuzz_bucket, body):
    assert_clean(call(server.rpc_socket, envelope(Op.KV_GET, body, fuzz_bucket, request_id="fuzz"), body))
    assert_same_daemon(server, daemon_pid)


@FUZZ
@given(body=st.one_of(st.binary(max_size=512), mutated(b"".join(bytes(p) for p in encode_put_batch([("fuzz/a", b"x" * 32), ("fuzz/b", b"y" * 16)])))))
def test_put_batches(server, daemon_pid, fuzz_bucket, body):
    assert_clean(call(server.rpc_socket, envelope(Op.KV_PUT, body, fuzz_bucket), body))
    assert_same_daemon(server, daemon_pid)


@FUZZ
@given(body=st.one_of(st.binary(max_size=512), mutated(encode_keys(["fuzz/a", "fuzz/b", "fuzz/c"]))))
def test_key_lists(server, daemon_pid, fuzz_bucket, body):
    assert_clean(call(server.rpc_socket, envelope(Op.KV_LOOKUP, body, fuzz_bucket), body))
    assert_same_daemon(server, daemon_pid)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


@FUZZ
@given(line=st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ") + b"\n"),
    st.dictionaries(st.sampled_from(["op", "body", "tenant", "bucket", "size", "region_id", "token", "x"]), json_values, max_size=6)
    .map(lambda d: json.dumps({**d, "body": 0} if "body" in d else d).encode() + b"\n"),
    st.builds(lambda op, fields: json.dumps({"op": op, **fields}).encode() + b"\n",
              st.sampled_from([o.value for o in Op]), st.dictionaries(st.sampled_from(["tenant", "bucket", "size", "region_id", "token"]),
                                                                     json_values, max_size=4)),
))
def test_envelopes(server, daemon_pid, line):
    assert_clean(call(server.rpc_socket, line))
    assert_same_daemon(server, daemon_pid)

