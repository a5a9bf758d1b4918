"""A bounded cache of open, read-only descriptors of object files, shared by transfers.

A 64K-token prefix at G=16 names 3,584 chunk files; opening and closing them
costs about 13 ms per fetch on this class of machine, a few percent of the whole
transfer and all of it before the first layer. Caching is sound because the
local-disk store never changes a published file and never reuses its name: an
fd opened for a path reads that path's bytes for as long as the path is what
the metadata says the key is, and the metadata is still consulted on every
fetch (only the ``open`` is skipped).

Entries in use by a running transfer are never closed; idle ones are closed in
LRU order above ``capacity``. A file unlinked by a delete or overwrite (in
either process) keeps its disk space while an fd holds it, so :meth:`sweep`
closes idle fds whose file has no links left; the daemon calls it periodically.
A store that does reuse a name (the s3 backend's chunk cache writes a refetched
chunk at the same path) calls :meth:`forget` when it unlinks one: the next
acquire opens the new file, and a transfer holding the old one keeps reading it
until it releases (by fd, so the old entry is the one released).

With a :class:`~storage_server.store.mapped_files.MappedFiles`, an entry acquired
with its size also keeps the file mapped (see that module): the executor gathers a
layer of mapped chunks with one copy instead of a ``preadv`` per chunk. A mapping
lives exactly as long as its entry, so a chunk a transfer holds stays mapped.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from .mapped_files import MappedFiles, MappedSlot


class MissingFile(Exception):
    """``paths[index]`` does not exist (its object was deleted after it was located)."""

    def __init__(self, index: int) -> None:
        super().__init__(f"path #{index} does not exist")
        self.index = index


@dataclass
class _Entry:
    fd: int
    users: int = 0
    slot: MappedSlot | None = None
    map_tried: bool = False


class OpenFileCache:
    def __init__(self, capacity: int, mapper: MappedFiles | None = None) -> None:
        self.capacity = capacity
        self.mapper = mapper
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._forgotten: dict[int, _Entry] = {}  # fd -> an entry forgotten while a transfer held it
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def acquire_held(self, paths: list[str]) -> tuple[list[int], list[MappedSlot | None]] | None:
        """Every path's fd and mapping if all are open already (and tried for mapping): then a few
        dict operations, fit for the event loop; None (nothing taken) if any would need an ``open``."""
        entries = self._entries
        with self._lock:
            try:
                held = [entries[p] for p in paths]
            except KeyError:
                return None
            if self.mapper is not None and not all(e.map_tried for e in held):
                return None
            for p, e in zip(paths, held):
                e.users += 1
                entries.move_to_end(p)
            self.hits += len(paths)
        return [e.fd for e in held], [e.slot for e in held]

    async def open_all(self, paths: list[str], sizes: list[int] | None = None) -> tuple[list[int], list[MappedSlot | None]]:
        """Every path's fd and mapping, all or nothing (raises :class:`MissingFile`): on the loop when all are open and
        mapped already (a repeated prefix: no thread hop), else opened and mapped on a worker thread (thousands of opens)."""
        held = self.acquire_held(paths)
        if held is not None:
            return held
        fds = await asyncio.get_running_loop().run_in_executor(None, self.acquire, paths, sizes)
        return fds, self.slots(paths, fds)

    def acquire(self, paths: list[str], sizes: list[int] | None = None) -> list[int]:
        """Open (or reuse) every path; all or nothing. Raises :class:`MissingFile`.

        Cached paths are taken under one lock acquisition; only misses are opened, outside it.
        With ``sizes`` (what each file must hold) and a mapper, files not mapped yet are mapped
        (see :meth:`slots`); a file whose length differs is left unmapped.
        """
        fds: list[int | None] = [None] * len(paths)
        with self._lock:
            for i, path in enumerate(paths):
                entry = self._entries.get(path)
                if entry is not None:
                    entry.users += 1
                    self._entries.move_to_end(path)
                    fds[i] = entry.fd
            missing = [i for i, fd in enumerate(fds) if fd is None]
            self.hits += len(paths) - len(missing)
        try:
            for i in missing:
                try:
                    fd = os.open(paths[i], os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise MissingFile(i) from None
                fds[i] = self._insert(paths[i], fd).fd
        except BaseException:
            taken = [(p, fd) for p, fd in zip(paths, fds) if fd is not None]
            self.release([p for p, _ in taken], [fd for _, fd in taken])  # type: ignore[misc]
            raise
        if sizes is not None and self.mapper is not None:
            self._map(paths, sizes, fds)  # type: ignore[arg-type]
        self._trim()
        return fds  # type: ignore[return-value]

    def _map(self, paths: list[str], sizes: list[int], fds: list[int]) -> None:
        """Map held entries not tried yet (each is tried once: a refusal is not retried on every fetch)."""
        todo: list[tuple[_Entry, int]] = []
        with self._lock:
            for path, size, fd in zip(paths, sizes, fds):
                e = self._held(path, fd)
                if not e.map_tried:
                    e.map_tried = True
                    todo.append((e, size))
        for e, size in todo:  # the entries are held (users > 0): nobody closes them meanwhile
            e.slot = self.mapper.map(e.fd, size)  # type: ignore[union-attr]

    def _held(self, path: str, fd: int) -> _Entry:
        """The entry a caller holds for ``path`` through ``fd`` (forgotten meanwhile or not). Under the lock."""
        entry = self._entries.get(path)
        return entry if entry is not None and entry.fd == fd else self._forgotten[fd]

    def slots(self, paths: list[str], fds: list[int] | None = None) -> list[MappedSlot | None]:
        """The mappings of held paths (None where a file is not mapped); ``fds`` as ``acquire`` returned them."""
        with self._lock:
            if fds is None:
                return [self._entries[p].slot for p in paths]
            return [self._held(p, fd).slot for p, fd in zip(paths, fds)]

    def _insert(self, path: str, fd: int) -> _Entry:
        with self._lock:
            self.misses += 1
            entry = self._entries.get(path)
            if entry is not None:  # another transfer opened it meanwhile
                os.close(fd)
            else:
                entry = self._entries[path] = _Entry(fd)
            entry.users += 1
            self._entries.move_to_end(path)
            return entry

    def release(self, paths: list[str], fds: list[int] | None = None) -> None:
        """Give back entries taken by ``acquire``; with ``fds`` (what it returned), an entry forgotten meanwhile is
        the one given back (and closed once no transfer holds it)."""
        closing: list[_Entry] = []
        with self._lock:
            for i, path in enumerate(paths):
                entry = self._entries[path] if fds is None else self._held(path, fds[i])
                if entry.users == 1 and fds is not None and self._forgotten.get(fds[i]) is entry:
                    closing.append(self._forgotten.pop(fds[i]))
                entry.users -= 1
        for entry in closing:
            self._close(entry)
        self._trim()

    def forget(self, path: str) -> None:
        """``path`` was unlinked and may be written again: close its idle entry, or set a held one aside (it stays
        open and mapped for the transfers holding it, and is closed by their last ``release``)."""
        with self._lock:
            entry = self._entries.pop(path, None)
            if entry is not None and entry.users > 0:
                self._forgotten[entry.fd] = entry
                entry = None
        if entry is not None:
            self._close(entry)

    def _trim(self) -> None:
        """Close idle entries, oldest first, until within capacity."""
        with self._lock:
            excess = len(self._entries) - self.capacity
            idle: list[str] = []
            for path, entry in self._entries.items():  # oldest first
                if len(idle) >= excess:
                    break
                if entry.users == 0:
                    idle.append(path)
            doomed = [self._entries.pop(path) for path in idle]
        for entry in doomed:
            self._close(entry)

    def _close(self, entry: _Entry) -> None:
        if entry.slot is not None:
            self.mapper.unmap(entry.slot)  # type: ignore[union-attr]
            entry.slot = None
        os.close(entry.fd)

    def sweep(self) -> int:
        """Close idle fds of files that have been unlinked; returns how many."""
        with self._lock:
            idle = [(p, e.fd) for p, e in self._entries.items() if e.users == 0]
        gone = [(p, fd) for p, fd in idle if os.fstat(fd).st_nlink == 0]
        closed = 0
        with self._lock:
            for path, fd in gone:
                entry = self._entries.get(path)
                if entry is not None and entry.fd == fd and entry.users == 0:
                    del self._entries[path]
                    self._close(entry)
                    closed += 1
        return closed

    def status(self, kept: dict[str, int] | None = None) -> dict[str, int]:
        """Counts; ``kept``: references held between transfers (path -> how many), not counted as in use."""
        kept = kept or {}
        with self._lock:
            counts = {"files": len(self._entries), "in_use": sum(1 for p, e in self._entries.items() if e.users > kept.get(p, 0)),
                      "capacity": self.capacity, "hits": self.hits, "misses": self.misses, "forgotten_in_use": len(self._forgotten)}
        if self.mapper is not None:
            counts["mapped"] = self.mapper.status()["mapped"]
        return counts

    def close(self) -> None:
        with self._lock:
            entries, self._entries = [*self._entries.values(), *self._forgotten.values()], OrderedDict()
            self._forgotten = {}
        for e in entries:
            self._close(e)
        if self.mapper is not None:
            self.mapper.close()
