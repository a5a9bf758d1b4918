"""The direct frame stream's reads over a real socket pair: a burst of frames parsed from one receive, a payload that
began inside that receive, waits that keep the socket's reader registered, and a closed stream leaving no reader behind
(its descriptor number is reused by the next socket), and the read timeout: one timer per stream, moved on by
waits that got their bytes, firing only on a stream silent for the whole timeout."""

import asyncio
import socket

import pytest

from client_sdk.direct import FRAME_BURST, DirectFrameStream
from protocol.errors import ErrorCode, S3Error
from protocol.wire import FrameType, pack_frame


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return ours, theirs


def test_burst_of_frames_then_a_payload_across_the_receive():
    async def main():
        ours, theirs = _pair()
        stream = DirectFrameStream(ours, read_timeout=30)
        payload = bytes(range(256)) * 64  # 16 KiB: begins inside the first receive, ends past it
        theirs.sendall(b"".join(pack_frame(FrameType.LAYER, layer, layer * 10, 10) for layer in range(3))
                       + pack_frame(FrameType.DATA, 3, 30, len(payload)) + payload)
        got = [await stream.next_frame() for _ in range(4)]
        assert [(f.type, f.layer, f.offset) for f in got] == [(FrameType.LAYER, i, i * 10) for i in range(3)] + [(FrameType.DATA, 3, 30)]
        dest = bytearray(len(payload))
        await stream.read_into(memoryview(dest), len(payload))
        assert bytes(dest) == payload and len(payload) > FRAME_BURST
        stream.close()
        theirs.close()
    asyncio.run(main())


def test_waits_before_each_frame_and_close_leaves_no_reader():
    async def main():
        loop = asyncio.get_running_loop()
        for round in range(4):  # each stream's socket likely reuses the descriptor number the one before closed
            ours, theirs = _pair()
            stream = DirectFrameStream(ours, read_timeout=30)
            for layer in range(4):
                pending = asyncio.ensure_future(stream.next_frame())
                await asyncio.sleep(0.01)  # the stream is waiting, its reader registered
                assert not pending.done()
                theirs.sendall(pack_frame(FrameType.LAYER, layer))
                frame = await asyncio.wait_for(pending, 30)
                assert (frame.type, frame.layer) == (FrameType.LAYER, layer)
            if round % 2:  # bytes nobody waits for: the reader is dropped (no busy loop), the next read takes them at once
                theirs.sendall(pack_frame(FrameType.LAYER, 9))
                await asyncio.sleep(0.01)
                assert (await stream.next_frame()).layer == 9
            # else: closed while its reader is still registered (the last wait's)
            fd = ours.fileno()
            stream.close()
            theirs.close()
            assert not loop.remove_reader(fd)  # nothing left registered for the closed descriptor
    asyncio.run(main())


def test_end_of_stream_while_waiting():
    async def main():
        ours, theirs = _pair()
        stream = DirectFrameStream(ours, read_timeout=30)
        pending = asyncio.ensure_future(stream.next_frame())
        await asyncio.sleep(0.01)
        theirs.close()
        assert await asyncio.wait_for(pending, 30) is None and stream.broken
        stream.close()
    asyncio.run(main())


def test_a_stream_silent_for_its_read_timeout_is_broken_with_request_timeout():
    async def main():
        ours, theirs = _pair()
        stream = DirectFrameStream(ours, read_timeout=1.0)
        # Frames every 0.25 s for 2.5 s: each wait has its bytes in time, though the stream lasts two and a half
        # timeouts (the one timer set for the first wait's deadline is moved on, never fired on a wait that got its bytes).
        for layer in range(10):
            pending = asyncio.ensure_future(stream.next_frame())
            await asyncio.sleep(0.25)
            theirs.sendall(pack_frame(FrameType.LAYER, layer))
            assert (await asyncio.wait_for(pending, 30)).layer == layer
        loop = asyncio.get_running_loop()
        t = loop.time()
        with pytest.raises(S3Error) as e:
            await stream.next_frame()
        assert e.value.code is ErrorCode.RequestTimeout and "1 s" in e.value.message
        assert 0.95 <= loop.time() - t < 10 and stream.broken
        stream.close()
        theirs.close()
    asyncio.run(main())


def test_a_closed_stream_leaves_no_timer_behind():
    async def main():
        ours, theirs = _pair()
        stream = DirectFrameStream(ours, read_timeout=30)
        pending = asyncio.ensure_future(stream.next_frame())
        await asyncio.sleep(0.01)
        theirs.sendall(pack_frame(FrameType.LAYER, 0))
        await asyncio.wait_for(pending, 30)
        assert stream._watchdog is not None  # set by the wait, still pending
        stream.close()
        assert stream._watchdog is None
        theirs.close()
    asyncio.run(main())


def test_no_read_timeout_waits_with_no_timer():
    async def main():
        ours, theirs = _pair()
        stream = DirectFrameStream(ours, read_timeout=None)  # the client's read_timeout=None: no deadline
        pending = asyncio.ensure_future(stream.next_frame())
        await asyncio.sleep(0.05)
        assert not pending.done() and stream._watchdog is None
        theirs.sendall(pack_frame(FrameType.LAYER, 0))
        assert (await asyncio.wait_for(pending, 30)).layer == 0
        stream.close()
        theirs.close()
    asyncio.run(main())
