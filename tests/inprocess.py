"""An ObjectCache node (storage server + gateway) inside the test process, for tests that inject pacers.

Subprocess fixtures (``support.ServerProcess``) are the real thing for
end-to-end, crash and kill tests; this one exists so a test can hand the
storage server a :class:`LayerGate` and show with events, not timing, what
happens while a transfer is held before a layer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import uvloop

from gateway.server import start_gateway
from protocol.config import load_config
from storage_server.daemon import StorageServer
from storage_server.kv_service import PacerFactory, TransferInfo, VerbsOpener
from storage_server.store import open_chunk_source, open_object_store


class LayerGate:
    """A pacer factory: the next transfer started after :meth:`hold_before` stops before that layer until :meth:`open`.

    Thread-safe: the test thread arms and opens it, the server's loop waits on it.
    """

    def __init__(self) -> None:
        self._armed: int | None = None
        self._lock = threading.Lock()
        self.held = threading.Event()
        self.released = threading.Event()

    def hold_before(self, layer: int) -> None:
        with self._lock:
            self._armed = layer
            self.held.clear()
            self.released.clear()

    def wait_held(self, timeout: float = 30) -> bool:
        return self.held.wait(timeout)

    def open(self) -> bool:
        """Let the held transfer go on; whether one was held."""
        was_held = self.held.is_set()
        self.released.set()
        return was_held

    def __call__(self, info: TransferInfo) -> "_GatePacer | None":
        with self._lock:
            layer, self._armed = self._armed, None
        return None if layer is None else _GatePacer(self, layer)


class _GatePacer:
    def __init__(self, gate: LayerGate, before: int) -> None:
        self.gate, self.before, self.layer = gate, before, 0

    async def before_layer(self, nbytes: int) -> None:
        if self.layer == self.before:
            self.gate.held.set()
            deadline = time.monotonic() + 60  # bounded: a forgotten gate cannot hang the suite
            while not self.gate.released.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        self.layer += 1

    def after_layer(self) -> None:
        pass


class InProcessNode:
    """Storage server + gateway on a background event loop; ``endpoint`` and ``rpc_socket`` as the subprocess fixture has."""

    def __init__(self, config_path: Path, pacers: Sequence[PacerFactory] = (), open_verbs: VerbsOpener | None = None) -> None:
        self.config = load_config(config_path)
        self.pacers = list(pacers)
        self.open_verbs = open_verbs
        self.endpoint = ""
        self.rpc_socket = str(self.config.rpc_socket)
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="in-process-node", daemon=True)
        self._stop: list = []

    def start(self) -> "InProcessNode":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        cfg = self.config
        store = open_object_store(cfg)
        extra = {"open_verbs": self.open_verbs} if self.open_verbs is not None else {}
        self.storage_server = StorageServer(cfg, store, open_chunk_source(cfg, store), self.pacers, **extra)
        rpc = await self.storage_server.start()
        port, stop_gateway = await start_gateway(cfg, open_object_store(cfg), "127.0.0.1", 0)
        self.endpoint = f"http://127.0.0.1:{port}"

        async def stop() -> None:
            await stop_gateway()
            rpc.close()
            await rpc.wait_closed()
            await self.storage_server.close()

        self._stop.append(stop)

    def stop(self) -> None:
        for stop in self._stop:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def gated_node(tmp_path: Path, name: str):
    """A tenant ``name``, a 4-layer tiny layout and an in-process node whose transfers a :class:`LayerGate` can hold."""
    from kvsupport import tiny_layout
    from support import make_tenants, write_config

    tenant = make_tenants(name)[0]
    config = write_config(tmp_path / "c.toml", tmp_path / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\ntheta_bytes = 0\n'))
    gate = LayerGate()
    return tenant, tiny_layout(64, num_layers=4), gate, InProcessNode(config, pacers=[gate]).start()
