"""The pyverbs engine's logic against the fake verbs layer (tests/fakeverbs.py); a real loopback where a device exists.

No RDMA device exists on the machines these tests usually run on, so the NIC is the fake: it
checks each work request as hardware would and performs the writes into local memory.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fakeverbs import Fabric
from hypothesis import given
from hypothesis import strategies as st

from client_sdk.verbs import VerbsBuffer
from protocol.errors import S3Error
from protocol.kv_http import RdmaRegisterRequest, RegisterReply, VerbsPeer
from protocol.pyverbs_device import PyverbsDevice, verbs_available
from protocol.verbs import Completion, Opcode, QpLink, QpState, Sge, decode_imm, encode_imm
from storage_server.transports.verbs_engine import VerbsEngine, split_writes


def client_end(fabric: Fabric, size: int, lid: int = 2):
    """A client's registered buffer, its queue pair with receives posted, and its VerbsPeer."""
    dev = fabric.device(lid)
    buf = np.zeros(size, np.uint8)
    mr = dev.reg_mr(buf.ctypes.data, buf.nbytes, remote_write=True)
    cq = dev.create_cq(64)
    link = QpLink(dev, cq, 1, 64, remote_write=True)
    for i in range(64):
        dev.post_recv(link.qp, i)
    return buf, mr, cq, link


def connected(fabric: Fabric, size: int = 4096, max_sge: int = 4, max_msg_bytes: int = 1 << 20):
    engine = VerbsEngine(fabric.device(1, max_sge, max_msg_bytes))
    buf, mr, cq, link = client_end(fabric, size)
    conn, server_end = engine.connect(link.local(mr.rkey), buf.ctypes.data, buf.nbytes)
    link.connect(server_end)
    client = VerbsBuffer(buf, mr, link, cq, b"r", b"t")
    return engine, conn, client


@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=20), max_sge=st.integers(1, 5), max_msg=st.integers(1, 700))
def test_work_requests_stay_within_max_sge_and_message_size_and_cover_every_byte_once(lengths, max_sge, max_msg):
    segments, addr = [], 1 << 20
    for i, n in enumerate(lengths):
        segments.append(Sge(addr, n, lkey=i))
        addr += n + 64  # scattered in local memory
    wrs = split_writes(segments, 5000, max_sge, max_msg)
    assert all(1 <= len(w.sges) <= max_sge and w.length <= max_msg and w.length == sum(s.length for s in w.sges) for w in wrs)
    # Remote ranges are consecutive from 5000; local bytes are taken in order, none twice.
    assert [w.remote_addr for w in wrs] == list(np.cumsum([5000] + [w.length for w in wrs[:-1]]))
    local = [(s.lkey, a) for w in wrs for s in w.sges for a in range(s.addr, s.addr + s.length)]
    assert local == [(i, a) for i, s in enumerate(segments) for a in range(s.addr, s.addr + s.length)]


def test_immediates_carry_tag_and_layer():
    assert decode_imm(encode_imm(0xBEEF, 65535)) == (0xBEEF, 65535)
    assert decode_imm(encode_imm(1, 0)) == (1, 0)
    for bad in ((0, 1 << 16), (1 << 16, 0), (-1, 0)):
        with pytest.raises(ValueError):
            encode_imm(*bad)


def test_queue_pairs_walk_reset_init_rtr_rts_once():
    fabric = Fabric()
    engine, conn, client = connected(fabric)
    assert [q.transitions for q in fabric.qps.values()] == [[QpState.INIT, QpState.RTR, QpState.RTS]] * 2
    assert conn.link.state is QpState.RTS and client.link.state is QpState.RTS
    with pytest.raises(S3Error) as e:
        client.link.connect(conn.link.local())
    assert "connects once" in e.value.message
    # A peer no device could have is refused, naming the field, before any verbs call.
    bad = VerbsPeer(qp_num=1 << 24, psn=0, lid=0, gid="00" * 16)
    with pytest.raises(S3Error) as e:
        engine.connect(bad, 4096, 10)
    assert e.value.extra["ArgumentName"] == "verbs.qp_num"
    with pytest.raises(S3Error) as e:
        VerbsPeer(1, 1, 1, "zz").check()
    assert e.value.extra["ArgumentName"] == "verbs.gid"


def test_a_device_refusing_a_transition_leaves_the_queue_pair_in_error():
    fabric = Fabric()
    dev = fabric.device(1)
    link = QpLink(dev, dev.create_cq(4), 4, 4, remote_write=False)
    with pytest.raises(S3Error) as e:
        link.connect(VerbsPeer(0xFFFFFF, 0, 0, "00" * 16))  # no such queue pair on the fabric: RTR fails
    assert e.value.code.name == "ServiceUnavailable" and "could not move to RTR" in e.value.message
    assert link.state is QpState.ERROR
    with pytest.raises(S3Error) as e:
        link.require_ready()
    assert "register the memory again" in e.value.message


def test_layers_are_written_split_and_announced_with_tagged_immediates():
    fabric = Fabric()
    engine, conn, client = connected(fabric, size=4096, max_sge=2, max_msg_bytes=100)
    staging = np.arange(1000, dtype=np.uint16).astype(np.uint8)
    mr = conn.register(staging)
    tag = conn.begin()
    client.expect(tag)

    async def go():
        await conn.write(staging[:250], mr, 0)
        await conn.notify(tag, 0)
        await conn.write_segments([Sge(staging[250:].ctypes.data + i * 50, 50, mr.lkey) for i in range(3)], 250)
        await conn.notify(tag, 1)
        await client.wait_layer(0)
        await client.wait_layer(1)

    asyncio.run(go())
    assert np.array_equal(client.buf[:400], staging[:400]) and not client.buf[400:].any()
    writes = fabric.writes(imm=False)
    assert [w.length for w in writes] == [100, 100, 50, 100, 50] and all(w.length <= 100 and len(w.sges) <= 2 for w in writes)
    assert [decode_imm(w.imm) for w in fabric.writes(imm=True)] == [(tag, 0), (tag, 1)]
    assert client.landed == {0, 1}


def test_the_server_never_writes_outside_the_registered_region():
    fabric = Fabric()
    engine, conn, client = connected(fabric, size=1024)
    staging = np.ones(512, np.uint8)
    mr = conn.register(staging)
    for offset, n in ((600, 512), (-1, 10), (1024, 1)):
        with pytest.raises(S3Error) as e:
            asyncio.run(conn.write(staging[:n], mr, offset))
        assert e.value.code.name == "AccessDenied" and "registered" in e.value.message
    assert fabric.writes() == [] and not client.buf.any()


def test_a_failed_completion_is_a_clear_error_and_breaks_the_connection():
    fabric = Fabric()
    engine, conn, client = connected(fabric)
    staging = np.ones(64, np.uint8)
    mr = conn.register(staging)
    fabric.fail_next("write", "IBV_WC_REM_ACCESS_ERR")
    with pytest.raises(S3Error) as e:
        asyncio.run(conn.write(staging, mr, 0))
    assert e.value.code.name == "ServiceUnavailable" and "IBV_WC_REM_ACCESS_ERR" in e.value.message
    assert conn.broken
    with pytest.raises(S3Error) as e:  # nothing more is posted on a broken queue pair
        asyncio.run(conn.notify(1, 0))
    assert "ERROR" in e.value.message and len(fabric.writes()) == 1


def test_the_client_drops_immediates_of_another_request():
    fabric = Fabric()
    engine, conn, client = connected(fabric)
    client.expect(7)

    async def go():
        await conn.notify(6, 0)  # left over from an abandoned request on this buffer
        await conn.notify(7, 1)
        await client.wait_layer(1)

    asyncio.run(go())
    assert client.landed == {1}
    assert len(client.link.qp.recvs) == 64  # each consumed receive was posted again


def test_a_client_side_error_completion_is_a_clear_error():
    fabric = Fabric()
    engine, conn, client = connected(fabric)
    client.expect(1)
    client.cq.append(Completion(3, Opcode.RECV_WITH_IMM, ok=False, status="IBV_WC_WR_FLUSH_ERR"))
    with pytest.raises(S3Error) as e:
        asyncio.run(client.wait_layer(0))
    assert e.value.code.name == "ServiceUnavailable" and "IBV_WC_WR_FLUSH_ERR" in e.value.message
    assert client.link.state is QpState.ERROR


def test_registration_records_round_trip_through_json():
    peer = VerbsPeer(0x123456, 0xABCDEF, 7, "fe80" + "00" * 14, rkey=0xDEADBEEF)
    req = RdmaRegisterRequest("pyverbs", 4096, 1 << 20, verbs=peer)
    assert RdmaRegisterRequest.from_json(req.to_json()) == req
    reply = RegisterReply("aa", "bb", 10, VerbsPeer(1, 2, 3, "00" * 16))
    assert RegisterReply.from_json(reply.to_json()) == reply
    assert RegisterReply("aa", "bb", 10).to_json() == {"region_id": "aa", "token": "bb", "size": 10}  # shm and nixl: as before
    with pytest.raises(S3Error) as e:
        RdmaRegisterRequest.from_json({**req.to_json(), "verbs": {"qp_num": 1}})
    assert e.value.extra["ArgumentName"] == "psn"


@pytest.mark.skipif(not verbs_available()[0], reason=f"no real verbs here: {verbs_available()[1]}")
def test_real_device_loopback():
    """Two queue pairs on the first device, connected to each other: WRITE then WRITE_WITH_IMM, for real."""
    server_dev, client_dev = PyverbsDevice(), PyverbsDevice()
    engine = VerbsEngine(server_dev)
    buf = np.zeros(1 << 16, np.uint8)
    mr = client_dev.reg_mr(buf.ctypes.data, buf.nbytes, remote_write=True)
    cq = client_dev.create_cq(64)
    link = QpLink(client_dev, cq, 1, 64, remote_write=True)
    for i in range(64):
        client_dev.post_recv(link.qp, i)
    conn, server_end = engine.connect(link.local(mr.rkey), buf.ctypes.data, buf.nbytes)
    link.connect(server_end)
    client = VerbsBuffer(buf, mr, link, cq, b"r", b"t")
    staging = np.random.default_rng(1).integers(0, 256, 1 << 15, dtype=np.uint8)
    smr = conn.register(staging)
    tag = conn.begin()
    client.expect(tag)

    async def go():
        await conn.write(staging, smr, 4096)
        await conn.notify(tag, 3)
        await client.wait_layer(3)

    asyncio.run(go())
    assert np.array_equal(buf[4096 : 4096 + staging.nbytes], staging)


@pytest.mark.skipif(verbs_available()[0], reason="this host has a device: the engine opens")
def test_the_pyverbs_engine_without_a_device_is_a_clear_501():
    from storage_server.registrations import open_pyverbs

    with pytest.raises(S3Error) as e:
        open_pyverbs("")
    assert e.value.code.name == "NotImplemented" and "pyverbs engine cannot run" in e.value.message and verbs_available()[1] in e.value.message
