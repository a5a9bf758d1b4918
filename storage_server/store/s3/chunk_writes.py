"""Writing chunk files off the event loop: whole chunks, and a fetched chunk piece by piece with a decoder fed as it
streams in (a compressed chunk's decoded copy, built while the rest of it arrives)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol


async def as_stream(data: bytes | memoryview) -> AsyncIterator[bytes]:
    yield bytes(data)


def append_pieces(path: Path, pieces: list[bytes]) -> None:
    with open(path, "ab") as f:
        for p in pieces:
            f.write(p)


class StreamFeed(Protocol):
    """A decoder fed as a fetched chunk streams in (:class:`storage_server.stream_decode.StreamedCopy`); ``off``: it
    wants nothing more (a raw chunk, no room, a failure)."""

    off: bool

    def feed(self, path: Path, written: int) -> None: ...
    def finish(self, committed: Path) -> None: ...
    def abandon(self) -> None: ...


def write_fed(path: Path, pieces: list[bytes], feed: StreamFeed | None, written: int) -> None:
    """Fetched pieces written, then (same thread, off the loop) whatever layers they complete handed to the decoder."""
    append_pieces(path, pieces)
    if feed is not None:
        feed.feed(path, written)


def write_each(files: list[tuple[Path, bytes]]) -> None:
    for path, data in files:
        append_pieces(path, [data])
