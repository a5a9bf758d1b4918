"""The embedded local-disk store, one job per module.

* :mod:`.index`      — the metadata index (SQLite schema and queries).
* :mod:`.blobs`      — durable blob files (temp file, fsync, rename into never-reused names).
* :mod:`.cleanup`    — crash clean-up (unacknowledged temp files, unreferenced object files).
* :mod:`.store`      — :class:`LocalDiskStore`, the object store composing them.
* :mod:`.chunks`     — :class:`LocalDiskChunkSource`, the KV path's view: chunk files pinned through
* :mod:`.open_files` — a shared cache of open chunk files.
"""

from .chunks import LocalDiskChunkSource
from .store import LocalDiskStore

__all__ = ["LocalDiskChunkSource", "LocalDiskStore"]
