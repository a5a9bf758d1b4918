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

import fcntl

TICKET_BYTES = 32
TICKET_TTL_S = 30.0  # a ticket not used within this long is forgotten
# Seals a registered memfd must carry: it can never shrink (no SIGBUS in the server) and gains no other seal.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
