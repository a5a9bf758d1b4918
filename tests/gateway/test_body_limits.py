"""Request bodies are streamed: what a client declares never decides how much memory the gateway holds."""

from __future__ import annotations

import http.client
from pathlib import Path
from urllib.parse import urlsplit

from rawhttp import sign
from support import boto_client, serving

CHUNK = 256 << 20


def gateway_pid(serve_pid: int) -> int:
    """The gateway child of an ``objectcache serve`` process (forked by one of its threads: ``objectcache.lifeline``)."""
    for task in Path(f"/proc/{serve_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if "gateway" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                return int(child)
    raise AssertionError("no gateway child found")


def peak_rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_one_huge_aws_chunked_chunk_is_streamed_not_buffered(tmp_path):
    """One 256 MiB aws-chunked chunk (the audit's 1 GiB chunk took the gateway from 289 MB to 2.3 GB)."""
    with serving(tmp_path) as (proc, tenant, _):
        boto_client(proc.endpoint, tenant).create_bucket(Bucket="chunky")
        pid = gateway_pid(proc.proc.pid)
        before = peak_rss_bytes(pid)
        trailer = b"0\r\n\r\n"
        head = f"{CHUNK:x}\r\n".encode()
        length = len(head) + CHUNK + 2 + len(trailer)
        headers = sign(tenant, "PUT", f"{proc.endpoint}/chunky/big",
                       {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(CHUNK), "Content-Length": str(length)},
                       payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
        u = urlsplit(proc.endpoint)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        conn.putrequest("PUT", "/chunky/big", skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(head)
        piece = bytes(range(256)) * 4096  # 1 MiB
        for _ in range(CHUNK // len(piece)):
            conn.send(piece)
        conn.send(b"\r\n" + trailer)
        r = conn.getresponse()
        assert r.status == 200, r.read()
        conn.close()
        grown = peak_rss_bytes(pid) - before
        assert grown < 64 << 20, f"the gateway's peak memory grew by {grown >> 20} MiB for one {CHUNK >> 20} MiB chunk"
        assert boto_client(proc.endpoint, tenant).head_object(Bucket="chunky", Key="big")["ContentLength"] == CHUNK
