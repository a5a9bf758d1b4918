"""A region the storage server cannot map is refused with a clear error reply (security audit round two,
item 17: when mmap of a handed-over memfd failed with ENOMEM the hand-over socket was closed unanswered)."""

from __future__ import annotations

import json
import resource

import pytest
from kvsupport import rpc
from rawhttp import signed
from support import serving

from client_sdk.buffers import ShmRegion, hand_over
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import RegisterTicket


def vm_size(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def register(proc, tenant, size: int) -> dict:
    r = signed(proc.endpoint, tenant, "POST", "/?kv-register", body=json.dumps({"size": size}).encode())
    assert r.status == 200, r.body
    ticket = RegisterTicket.from_json(json.loads(r.body))
    region = ShmRegion(size)  # sparse: nothing is touched here
    try:
        return hand_over(ticket.socket, bytes.fromhex(ticket.ticket), region.fd)
    finally:
        region.close()


def test_a_region_that_cannot_be_mapped_gets_an_error_reply(tmp_path):
    with serving(tmp_path) as (proc, tenant, sock):
        pid = rpc(str(sock), "status")["pid"]
        # The storage server's address space is capped a little above what it uses: a 2 GiB mapping fails (ENOMEM).
        limit = vm_size(pid) + (512 << 20)
        resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
        with pytest.raises(S3Error) as e:
            register(proc, tenant, 2 << 30)
        assert e.value.code == ErrorCode.ServiceUnavailable and "cannot map" in e.value.message, e.value
        assert e.value.extra.get("ArgumentName") == "size"
        # The server is fine: a region that fits is taken.
        reply = register(proc, tenant, 1 << 20)
        assert reply["size"] == 1 << 20 and reply["region_id"]
