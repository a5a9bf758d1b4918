"""The ``rdma`` transport's client side: memory registered with a NIXL agent, written one-sidedly by the server.

A buffer is registered once with this process's agent and with the storage server
(``kv-register-rdma``: the agent's metadata and the buffer's address travel over the
signed control plane) and reused across fetches; the server WRITEs each layer into it
and the LAYER frame on the HTTP stream says it has landed. NIXL's UCX backend picks
RDMA verbs where a device exists and CMA or TCP otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol.kv_http import proof_bytes
from protocol.nixl_agent import new_agent
from protocol.rdma_token import RdmaToken
from protocol.wire import Target, TransportKind

from .buffers import host_memory
from .destinations import BufferDestinations, Destination

MIN_BUFFER = 64 << 20


@functools.cache
def rdma_available() -> tuple[bool, str]:
    """Whether this process can use the rdma transport, and why not."""
    try:
        import nixl._api  # noqa: F401
    except ImportError as e:
        return False, f"nixl is not installed ({e}); pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1"
    return True, ""


class NixlClient:
    """This process's NIXL agent (UCX backend)."""

    def __init__(self) -> None:
        self.agent: Any = new_agent(f"objectcache-client-{os.getpid()}-{secrets.token_hex(4)}")

    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def register(self, buf: np.ndarray) -> Any:
        return self.agent.register_memory(self.agent.get_reg_descs([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM"))

    def deregister(self, handle: Any) -> None:
        self.agent.deregister_memory(handle)


@dataclass
class RdmaBuffer:
    """Registered memory and the capability the server gave for it."""

    buf: np.ndarray
    handle: Any
    region_id: bytes
    token: bytes
    busy: bool = field(default=False)
    user: bool = field(default=False)  # the caller's memory (``out``): used only when passed again


# Tells the server about a registered buffer: (agent metadata, address, size, the proof written at its start)
# -> (region id, token).
Register = Callable[[bytes, int, int, bytes], Awaitable[tuple[bytes, bytes]]]


class RdmaDestinations(BufferDestinations):
    kind = TransportKind.RDMA
    verify_by_default = False  # RDMA links check their own frames; verify=True still checks each layer's CRC32C

    def __init__(self, register: Register) -> None:
        self._register = register
        self._engine: NixlClient | None = None
        self._buffers: list[RdmaBuffer] = []
        self._lock = asyncio.Lock()

    async def acquire(self, payload_bytes: int, out: Any) -> Destination:
        """A registered buffer: the SDK's own, or ``out`` (the caller's host memory, registered once and reused)."""
        mine = host_memory(out, payload_bytes) if out is not None else None
        async with self._lock:
            if mine is not None:
                fits = [b for b in self._buffers if b.user and not b.busy and b.buf.ctypes.data == mine.ctypes.data
                        and b.buf.nbytes == mine.nbytes]
            else:
                fits = [b for b in self._buffers if not b.user and not b.busy and b.buf.nbytes >= payload_bytes]
            if fits:
                b = min(fits, key=lambda b: b.buf.nbytes)
            else:
                if self._engine is None:
                    self._engine = NixlClient()
                buf = mine if mine is not None else np.empty(max(payload_bytes, MIN_BUFFER), np.uint8)
                handle = self._engine.register(buf)
                proof = secrets.token_bytes(proof_bytes(buf.nbytes))
                buf[: len(proof)] = np.frombuffer(proof, np.uint8)  # the server reads it back through our agent
                try:
                    region_id, token = await self._register(self._engine.metadata(), buf.ctypes.data, buf.nbytes, proof)
                except BaseException:
                    self._engine.deregister(handle)
                    raise
                b = RdmaBuffer(buf, handle, region_id, token, user=mine is not None)
                self._buffers.append(b)
            b.busy = True
        target = Target(TransportKind.RDMA, b.region_id, b.token, 0, payload_bytes)
        return Destination(target, memoryview(b.buf)[:payload_bytes], rdma=b)

    def token(self, dest: Destination) -> RdmaToken:
        """NIXL names memory by agent and address: the token's rkey, LID and QP number stay 0."""
        return RdmaToken(dest.rdma.buf.ctypes.data, dest.view.nbytes)

    def _free(self, b: RdmaBuffer) -> None:
        if self._engine is not None:
            self._engine.deregister(b.handle)
