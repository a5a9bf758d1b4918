"""A transfer runs only while its client is there: ``_until_disconnect`` over a real socket. The peer closing stops the
work at its next suspension (``ConnectionAbortedError``, the transfer's clean-up run); a byte the client sends
mid-transfer stops it too and aborts the connection (it would be out of step for a kept connection's next request);
a shutdown's cancel stays a cancel; work that ends first returns its result and leaves the connection readable for the
next request (the watcher's read ended, nothing consumed). Whatever the work does with the cancel (raises something
else on its way out, or swallows it and returns), no cancel of ours is left pending on the task."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from storage_server.kv_service import _until_disconnect


async def _pair() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, socket.socket]:
    """The server side's streams of a socket pair, and the client's plain socket."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    return reader, writer, theirs


class Work:
    """A transfer that waits on ``go`` (its suspension point) and records whether its clean-up ran."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.cleaned_up = False

    async def __call__(self) -> str:
        try:
            await self.go.wait()
            return "stats"
        finally:
            self.cleaned_up = True


async def _client_leaves(kv_get: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[str]]) -> tuple[asyncio.Task, asyncio.StreamWriter]:
    """``kv_get(reader, writer)`` started, and its client gone while it runs: the running task and the server's writer."""
    reader, writer, client = await _pair()
    running = asyncio.ensure_future(kv_get(reader, writer))
    await asyncio.sleep(0.05)
    assert not running.done()
    client.close()
    return running, writer


def test_work_that_ends_first_returns_and_the_connection_reads_on():
    async def main():
        reader, writer, client = await _pair()
        work = Work()
        work.go.set()
        assert await _until_disconnect(reader, work(), writer) == "stats" and work.cleaned_up
        client.sendall(b"next request\n")  # the watcher's read is over: the next request's bytes are all there
        assert await asyncio.wait_for(reader.readline(), 10) == b"next request\n"
        assert not writer.transport.is_closing()
        writer.close()
        client.close()
    asyncio.run(main())


def test_the_peer_closing_stops_the_work_as_a_disconnect():
    async def main():
        work = Work()
        running, writer = await _client_leaves(lambda reader, writer: _until_disconnect(reader, work(), writer))
        with pytest.raises(ConnectionAbortedError):
            await asyncio.wait_for(running, 10)
        assert work.cleaned_up and running.cancelling() == 0  # our cancel taken back: nothing left pending
        writer.close()
    asyncio.run(main())


def test_a_byte_mid_transfer_stops_the_work_and_aborts_the_connection():
    async def main():
        reader, writer, client = await _pair()
        work = Work()
        running = asyncio.ensure_future(_until_disconnect(reader, work(), writer))
        await asyncio.sleep(0.05)
        client.sendall(b"x")
        with pytest.raises(ConnectionAbortedError):
            await asyncio.wait_for(running, 10)
        assert work.cleaned_up and writer.transport.is_closing()
        client.settimeout(10)
        assert client.recv(1) == b""  # the server side is gone: the connection is not kept
        client.close()
    asyncio.run(main())


def test_a_shutdown_cancel_stays_a_cancel():
    async def main():
        reader, writer, client = await _pair()
        work = Work()
        running = asyncio.ensure_future(_until_disconnect(reader, work(), writer))
        await asyncio.sleep(0.05)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert work.cleaned_up
        writer.close()
        client.close()
    asyncio.run(main())


def test_work_that_raises_something_else_once_cancelled_is_still_a_disconnect():
    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise OSError("a read thread failed as the transfer stopped") from None
        return "stats"

    async def main():
        running, writer = await _client_leaves(lambda reader, writer: _until_disconnect(reader, work(), writer))
        with pytest.raises(ConnectionAbortedError) as e:
            await asyncio.wait_for(running, 10)
        assert isinstance(e.value.__cause__, OSError) and running.cancelling() == 0
        writer.close()
    asyncio.run(main())


def test_work_that_swallows_the_cancel_returns_with_no_cancel_pending():
    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # as asyncio.wait_for does when its result came in the same turn as the cancel
        return "stats"

    async def kv_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        stats = await _until_disconnect(reader, work(), writer)
        await asyncio.sleep(0)  # what follows (the END frame's send) is not cancelled by a leftover request
        return stats

    async def main():
        running, writer = await _client_leaves(kv_get)
        assert await asyncio.wait_for(running, 10) == "stats" and running.cancelling() == 0
        writer.close()
    asyncio.run(main())


def test_a_cancel_left_from_before_does_not_turn_a_disconnect_into_a_cancel():
    async def kv_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
        task = asyncio.current_task()
        task.cancel()  # a cancel asked earlier and swallowed, its count never taken back
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass
        assert task.cancelling() == 1
        return await _until_disconnect(reader, Work()(), writer)

    async def main():
        running, writer = await _client_leaves(kv_get)
        with pytest.raises(ConnectionAbortedError):
            await asyncio.wait_for(running, 10)
        writer.close()
    asyncio.run(main())
