"""Durable blob files: a body is streamed into ``tmp/``, fsync'd, then renamed to a never-reused name.

Durability protocol for every write (PUT, copy, part, multipart complete, batched KV put):

1. write the bytes into ``tmp/<uuid>`` and ``fsync`` the file;
2. ``rename`` it to its final name ``objects/<xx>/<uuid>`` (or the upload's ``parts/`` folder)
   and ``fsync`` the directory;
3. the metadata index commits the row; only then is the write acknowledged, and the file the
   row used to point at is unlinked.

A full disk is ``507 InsufficientStorage``, and the partial file is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from protocol.checksums import Digester
from protocol.errors import ErrorCode, S3Error, storage_full

from ..object_store import BodyStream, PutSpec
from ..rules import verify_received as verify

WRITE_BUFFER = 1 << 20


def _find_syncfs() -> Callable[[int], int] | None:
    """Linux's syncfs(2): flush one filesystem (the os module has no wrapper)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


_syncfs = _find_syncfs()


@contextlib.contextmanager
def disk_space() -> Iterator[None]:
    """A full disk (or quota) becomes a clear S3 error instead of a 500."""
    try:
        yield
    except OSError as e:
        full = storage_full(e)
        if full is not None:
            raise full from None
        raise


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobFiles:
    def __init__(self, root: Path) -> None:
        self.objects_dir = root / "objects"
        self.tmp_dir = root / "tmp"
        self.parts_dir = root / "parts"
        for d in (root, self.objects_dir, self.tmp_dir, self.parts_dir):
            d.mkdir(parents=True, exist_ok=True)
        # Every fan-out directory exists, and its entry is durable, before any object is renamed into
        # one: a PUT fsyncs only the directory it renames into, never that directory's parent.
        for i in range(256):
            (self.objects_dir / f"{i:02x}").mkdir(exist_ok=True)
        fsync_dir(self.objects_dir)
        fsync_dir(root)

    def new_tmp(self) -> Path:
        return self.tmp_dir / uuid.uuid4().hex

    def _final_path(self) -> Path:
        name = uuid.uuid4().hex
        d = self.objects_dir / name[:2]
        d.mkdir(exist_ok=True)
        return d / name

    def publish(self, tmp: Path) -> Path:
        """An fsync'd temp file → its durable final name."""
        final = self._final_path()
        os.rename(tmp, final)
        fsync_dir(final.parent)
        return final

    def publish_many(self, tmps: list[Path]) -> list[Path]:
        """Several durable temp files → final names, the renames durable on return (one ``syncfs``,
        or one fsync per directory touched)."""
        finals = []
        for tmp in tmps:
            final = self._final_path()
            os.rename(tmp, final)
            finals.append(final)
        if _syncfs is not None:
            self.sync_filesystem()
        else:
            for d in {f.parent for f in finals}:
                fsync_dir(d)
        return finals

    def publish_group(self, tmps: list[Path]) -> list[Path]:
        """Several fsync'd temp files → final names in one directory, made durable by one fsync of it
        (a group commit's batch; names stay unique: the shared directory is only their first two hex digits)."""
        d = self._final_path().parent
        finals = [d / (d.name + uuid.uuid4().hex[2:]) for _ in tmps]
        done = 0
        try:
            for tmp, final in zip(tmps, finals):
                os.rename(tmp, final)
                done += 1
            fsync_dir(d)
        except BaseException:
            for final in finals[:done]:
                final.unlink(missing_ok=True)
            raise
        return finals

    def publish_part(self, upload_id: str, part_number: int, tmp: Path) -> Path:
        final = self.parts_dir / upload_id / f"{part_number:05d}-{uuid.uuid4().hex}"
        final.parent.mkdir(exist_ok=True)
        os.rename(tmp, final)
        fsync_dir(final.parent)
        return final

    def make_upload_dir(self, upload_id: str) -> None:
        (self.parts_dir / upload_id).mkdir(exist_ok=True)
        fsync_dir(self.parts_dir)  # a part's rename fsyncs this new directory, not its entry in parts/

    def remove_upload_dir(self, upload_id: str) -> None:
        shutil.rmtree(self.parts_dir / upload_id, ignore_errors=True)

    def write_batch(self, bodies: list[bytes | memoryview]) -> list[Path]:
        """Small bodies in new temp files, all durable on return: one ``syncfs`` of the store's
        filesystem (not every filesystem on the host, as ``sync`` would) where the kernel has it,
        else an ``fsync`` per file."""
        tmps: list[Path] = []
        try:
            with disk_space():
                for data in bodies:
                    tmps.append(self.new_tmp())
                    with open(tmps[-1], "wb") as f:
                        f.write(data)
                        if _syncfs is None:
                            f.flush()
                            os.fsync(f.fileno())
                if _syncfs is not None:
                    self.sync_filesystem()
        except BaseException:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            raise
        return tmps

    def sync_filesystem(self) -> None:
        fd = os.open(self.tmp_dir, os.O_RDONLY)
        try:
            if _syncfs is None:
                os.fsync(fd)
            elif _syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)

    async def receive(self, body: BodyStream, spec: PutSpec, limit: int, run: Callable[..., Awaitable]) -> tuple[Path, Digester]:
        """Stream ``body`` into an fsync'd temp file (blocking writes through ``run``), verifying size and digests."""
        tmp = self.new_tmp()
        digester = Digester(set(spec.checksum_algorithms) | set(spec.expected_checksums))
        with disk_space():
            f: BinaryIO = await run(open, tmp, "wb")
        try:
            with disk_space():
                buf: list[bytes] = []
                buffered = 0
                async for chunk in body:
                    digester.update(chunk)
                    if digester.size > limit:
                        raise S3Error(ErrorCode.EntityTooLarge)
                    buf.append(chunk)
                    buffered += len(chunk)
                    if buffered >= WRITE_BUFFER:
                        await run(f.writelines, buf)
                        buf, buffered = [], 0
                if buf:
                    await run(f.writelines, buf)
                verify(spec, digester)
                await run(_flush_and_close, f)
        except BaseException:
            _discard(f, tmp)
            raise
        return tmp, digester

    def concatenate(self, sources: list[tuple[int, int, int]]) -> Path:
        """(fd, start, length) ranges, in order, into one fsync'd temp file. The fds stay the caller's."""
        tmp = self.new_tmp()
        try:
            with disk_space(), open(tmp, "wb") as out:
                for fd, start, length in sources:
                    _copy_range(fd, out.fileno(), start, length)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp


def _discard(f: BinaryIO, tmp: Path) -> None:
    """Drop a refused upload's temp file before its error is answered. On a full disk the close itself fails
    (it flushes the bytes a short write left in the buffer: ENOSPC again); that must not skip the unlink, or the
    partial file keeps the disk full and every later PUT fails."""
    with contextlib.suppress(OSError):
        f.close()  # the fd is released even when the flush fails
    tmp.unlink(missing_ok=True)


def _flush_and_close(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _copy_range(src_fd: int, dst_fd: int, offset: int, count: int) -> None:
    """Kernel-side copy where possible (copy_file_range), plain reads otherwise."""
    while count > 0:
        try:
            n = os.copy_file_range(src_fd, dst_fd, min(count, 1 << 30), offset)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            n = 0
        if n == 0:
            data = os.pread(src_fd, min(count, WRITE_BUFFER), offset)
            if not data:
                raise S3Error(ErrorCode.InternalError, "source object shorter than its metadata")
            n = os.write(dst_fd, data)
        offset += n
        count -= n
