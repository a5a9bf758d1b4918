"""The storage server's NIXL agent: one-sided WRITEs into memory clients registered with theirs.

NIXL's UCX backend uses RDMA verbs (RoCE/InfiniBand) where a device exists and CMA or TCP
otherwise, so the same code runs on any machine. The agent is created on the first RDMA
registration; ``nixl`` is an optional dependency (``pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1``).

Client agents are known for as long as a registered region uses them (each costs the agent
about 40 KiB, and a tenant could register thousands of names): the last region's link to go
forgets the agent, so they are bounded like regions (per tenant, dropped when idle). An
agent's name belongs to the tenant that registered it first, until it is forgotten.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.errors import ErrorCode, S3Error
from protocol.nixl_agent import new_agent
from protocol.rdma_token import RdmaToken

log = logging.getLogger("objectcache.storage_server.nixl")

# Poll a transfer's state this often once it is not done at once (uvloop timers are ms-grained).
POLL_S = 0.0005


def nixl_available() -> tuple[bool, str]:
    """Whether the NIXL engine can run here, and why not."""
    try:
        import nixl._api  # noqa: F401
    except ImportError as e:
        return False, f"nixl is not installed ({e}); pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1"
    return True, ""


class Fenced(Exception):
    """The write's owner took it back (another path writes these bytes now): cancelled before it could progress."""


@dataclass
class KnownAgent:
    """A client agent this engine has loaded: whose it is and how many region links use it."""

    tenant: str
    links: int = 0


class NixlEngine:
    def __init__(self, name: str | None = None, timeout_s: float = 30.0) -> None:
        ok, why = nixl_available()
        if not ok:
            raise S3Error(ErrorCode.NotImplemented, f"The rdma transport needs NIXL on the storage server: {why}.")
        self.agent: Any = new_agent(name or f"objectcache-storage-server-{os.getpid()}")
        self.known: dict[bytes, KnownAgent] = {}
        # A write the client never completes (it stopped, or its metadata pointed somewhere that accepts
        # and never answers) must not hold the transfer forever.
        self.timeout_s = timeout_s

    def add_client(self, metadata: bytes, tenant: str) -> bytes:
        """Learn a client agent of ``tenant`` (from its metadata, sent over the control plane) for one more
        region link; its name. Each call is matched by one :meth:`forget`."""
        try:
            name = self.agent.add_remote_agent(metadata)
        except Exception as e:
            raise S3Error(ErrorCode.InvalidArgument, f"the NIXL agent metadata was refused ({e.__class__.__name__})",
                          extra={"ArgumentName": "agent"}) from None
        known = self.known.setdefault(name, KnownAgent(tenant))
        if known.tenant != tenant:
            raise S3Error(ErrorCode.AccessDenied, "the NIXL agent named in the metadata is another tenant's", extra={"ArgumentName": "agent"})
        known.links += 1
        return name

    def reuse(self, name: bytes, tenant: str) -> bool:
        """One more region link of an agent still known for ``tenant`` (no new connection); False if it is not."""
        known = self.known.get(name)
        if known is None or known.tenant != tenant:
            return False
        known.links += 1
        return True

    async def verify(self, name: bytes, addr: int, device: int, proof: bytes) -> None:
        """READ ``len(proof)`` bytes at ``addr`` through agent ``name`` and compare: metadata whose connection leads
        anywhere but to the registering client's memory (a rewritten port, another process) is refused here,
        before any write, within ``timeout_s``."""
        buf = np.zeros(len(proof), np.uint8)
        reg = self.register(buf)
        try:
            await self._xfer("READ", buf.ctypes.data, len(proof), name, addr, device)
        except TimeoutError:
            raise S3Error(ErrorCode.InvalidArgument, f"the NIXL agent the metadata describes did not answer within {self.timeout_s:g} s "
                          "(storage_server.rdma_timeout_s): is it this client's?", extra={"ArgumentName": "agent"}) from None
        except Exception as e:
            raise S3Error(ErrorCode.InvalidArgument, f"the memory could not be read through the NIXL agent the metadata describes "
                          f"({e.__class__.__name__})", extra={"ArgumentName": "agent"}) from None
        finally:
            self.deregister(reg)
        if not hmac.compare_digest(buf.tobytes(), proof):
            raise S3Error(ErrorCode.InvalidArgument, "the registered memory does not hold the proof: the NIXL agent metadata is not "
                          "this client's, or addr is not its registered memory", extra={"ArgumentName": "proof"})

    def forget(self, name: bytes) -> None:
        """One region link of agent ``name`` is gone; the last one forgets the agent (and its connection)."""
        known = self.known.get(name)
        if known is None:
            return
        known.links -= 1
        if known.links <= 0:
            del self.known[name]
            self.agent.remove_remote_agent(name)

    def register(self, buf: np.ndarray) -> Any:
        return self.agent.register_memory(self.agent.get_reg_descs([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM"))

    def deregister(self, handle: Any) -> None:
        self.agent.deregister_memory(handle)

    async def write(self, local_addr: int, nbytes: int, agent: bytes, remote_addr: int, device: int,
                    fenced: Callable[[], bool] | None = None) -> None:
        """WRITE ``nbytes`` from local registered memory to the client's, and wait until it has landed, at most
        ``timeout_s`` (TimeoutError: the write is cancelled, its link should not be used again). ``fenced`` is asked
        before every step that could make the write progress: once it says so, the write is cancelled (:class:`Fenced`)."""
        await self._xfer("WRITE", local_addr, nbytes, agent, remote_addr, device, fenced)

    async def _xfer(self, op: str, local_addr: int, nbytes: int, agent: bytes, remote_addr: int, device: int,
                    fenced: Callable[[], bool] | None = None) -> None:
        local = self.agent.get_xfer_descs([(local_addr, nbytes, 0)], "DRAM")
        remote = self.agent.get_xfer_descs([(remote_addr, nbytes, device)], "DRAM")
        handle = self.agent.initialize_xfer(op, local, remote, agent, b"")
        deadline = time.monotonic() + self.timeout_s
        state = ""
        try:
            if fenced is not None and fenced():
                raise Fenced
            state = self.agent.transfer(handle)
            while state != "DONE":
                if state == "ERR":
                    raise S3Error(ErrorCode.ServiceUnavailable, f"an RDMA {op.lower()} of the client's memory failed (did the client go away?)")
                if time.monotonic() > deadline:
                    raise TimeoutError
                await asyncio.sleep(0 if state == "PROC" else POLL_S)
                if fenced is not None and fenced():
                    raise Fenced
                state = self.agent.check_xfer_state(handle)
        finally:
            try:
                self.agent.release_xfer_handle(handle)  # cancels a write still in flight
            except Exception:
                if state == "DONE":
                    raise
                # NIXL keeps a handle it cannot cancel; the write's own failure is the one to report.
                log.warning("an RDMA %s with agent %r could not be cancelled", op, agent)


class NixlLink:
    """One client region reached through the NIXL agent: ``[addr, addr+size)`` of ``agent`` on ``device``."""

    broken = False  # UCX reconnects by itself: a failed write fails only its transfer; a timed-out one breaks the link

    def __init__(self, engine: NixlEngine, agent: bytes, addr: int, size: int, device: int = 0, metadata: bytes = b"") -> None:
        self.engine, self.agent, self.addr, self.size, self.device = engine, agent, addr, size, device
        self.metadata = metadata  # the client agent's, kept so a cluster peer can be granted this region (peer -> engine)
        self._closed = False

    def register(self, buf: np.ndarray) -> Any:
        return self.engine.register(buf)

    def deregister(self, handle: Any) -> None:
        self.engine.deregister(handle)

    def begin(self) -> int:
        return 0

    def matches(self, token: RdmaToken) -> bool:
        """NIXL names memory by agent and address, which the region holds: no key of the token to compare."""
        return True  # the LAYER frame is the notification: nothing to tag

    async def write(self, local: np.ndarray, handle: Any, offset: int, fenced: Callable[[], bool] | None = None) -> None:
        if offset < 0 or offset + local.nbytes > self.size:
            raise S3Error(ErrorCode.AccessDenied, f"an RDMA write of {local.nbytes} bytes at offset {offset} would leave the "
                          f"{self.size} bytes the tenant registered")
        try:
            await self.engine.write(local.ctypes.data, local.nbytes, self.agent, self.addr + offset, self.device, fenced)
        except TimeoutError:
            self.broken = True  # the next kv-get naming this region is told to register it again
            raise S3Error(ErrorCode.ServiceUnavailable, f"an RDMA write to the client did not complete within "
                          f"{self.engine.timeout_s:g} s (storage_server.rdma_timeout_s); register the memory again") from None

    async def notify(self, tag: int, layer: int) -> None:
        """Nothing: NIXL's write completed only once the bytes landed, and the LAYER frame follows."""

    def close(self) -> None:
        """The agent is forgotten with the last region that uses it."""
        if not self._closed:
            self._closed = True
            self.engine.forget(self.agent)
