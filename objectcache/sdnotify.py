"""systemd's readiness protocol (``Type=notify``) without a dependency: one datagram to ``$NOTIFY_SOCKET``.

``READY=1`` once the process serves, ``STOPPING=1`` when a drain starts. Without
``NOTIFY_SOCKET`` (not under systemd) every call is a no-op. A name starting
with ``@`` is an abstract socket.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``); whether a socket was there to send it to."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(state.encode())
        return True
    except OSError:
        return False
