"""The ``shm`` transport's registration contract: memory the client created, handed over itself.

A serving process creates a sealed ``memfd`` (it can never shrink, so nothing
the client does to it can make the server's mapping fault) and registers it in
two steps:

1. ``POST /?kv-register {"size": n}`` (signed, so it names the tenant) answers a
   one-time ticket and the storage server's hand-over socket
   (:class:`~protocol.kv_http.RegisterTicket`).
2. The client connects to that Unix socket and sends the ticket with the memfd
   attached (``SCM_RIGHTS``). The server checks the descriptor (a sealed memfd of
   at least ``n`` bytes), maps it, and answers one JSON line: a
   :class:`~protocol.kv_http.RegisterReply` (region id and capability token) or
   an error.

The server never opens memory by name, so no tenant can point it at a file it
does not own, and errors say nothing about anybody else's memory.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap

TICKET_BYTES = 32
TICKET_TTL_S = 30.0  # a ticket not used within this long is forgotten
# Seals a registered memfd must carry: it can never shrink (no SIGBUS in the server) and gains no other seal.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL

# Linux 5.14+: fault in (allocate and map writable) a whole range in one call. Python's mmap
# has no MAP_POPULATE, and its madvise() keeps the GIL: this goes through ctypes, which drops it.
MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def populate(mm: mmap.mmap, length: int) -> None:
    """Fault in the first ``length`` bytes of a shared mapping now, so no later access faults.

    One ``madvise(MADV_POPULATE_WRITE)`` where the kernel has it (the GIL is released
    meanwhile, so a worker thread can do it beside an event loop); otherwise one read per
    page, which changes nothing in the memory.
    """
    length = min(length, len(mm))
    anchor = ctypes.c_char.from_buffer(mm)  # the mapping's address; released before returning
    try:
        if _libc.madvise(ctypes.addressof(anchor), length, MADV_POPULATE_WRITE) == 0:
            return
    finally:
        del anchor
    mm[:length:mmap.PAGESIZE]  # an older kernel: touch one byte per page
