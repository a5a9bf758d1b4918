"""Constants the ``shm`` transport's client and server share."""

from __future__ import annotations

import re
from pathlib import Path

SHM_DIR = Path("/dev/shm")
# The first bytes of a region carry a random nonce that the registering client wrote.
NONCE_BYTES = 16
# A region is named by a plain file name inside SHM_DIR (no path, no dot-dot).
SHM_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
