"""How ``bench peers`` stores a case's chunks in each peer and reads them back layer-major, as their users would.

Every reader fills ``dest`` (``L·N·S`` bytes, ``[layer][chunk][slice]``) and returns when layer 0 was
complete, in seconds from its start (None: only at the end):

* **Mooncake** keeps one object per chunk (all layers) and reads with ``batch_get_into_multi_buffers``,
  which puts each chunk's layer slices straight into their slots of ``dest`` (registered memory):
  same host through the ``mooncake_client`` process's shared memory (a "dummy" client,
  ``setup_dummy``; its ``dest`` comes from that shared pool; all chunks in one call), or over the TCP
  transport (a client with no segment of its own), which pays per slice: there whole chunks are read
  with ``batch_get_into`` into a staging buffer, 16 MiB a batch, and scattered (at G16 faster here
  than each layer slice straight into ``dest``, whose thousands of small slices in one batch also
  overflow its lanes' queues: the get fails with -800). One object per
  chunk per layer, a layer per ``batch_get_into``, would give layer 0 early but was an order of
  magnitude slower here (same host, G16×256 ÷16: 0.2 against 2.4 GB/s), so Mooncake is compared
  at its faster layout; layer 0 is complete with the last chunk.
* **Redis** keeps one value per chunk per layer and reads a layer with one ``MGET``.
* **LMCache's server** keeps one object per chunk (all layers, its unit) and answers one ``GET``
  at a time per connection, as its ``lm://`` connector asks; each chunk is scattered into ``dest``,
  so layer 0 is complete only when the last chunk is.
"""

from __future__ import annotations

import ctypes
import socket
import time
from dataclasses import dataclass

import numpy as np

from client_sdk import KVLayout

from .peer_servers import LMCacheServer, Mooncake, PeerUnavailable, Redis

MOONCAKE_PUT_BATCH = 16
MOONCAKE_TCP_BATCH_BYTES = 16 << 20


@dataclass
class Case:
    """One G × N case: ``chunks`` as stored (``[N][L·S]``), ``expected`` the layer-major payload every path must deliver."""

    tag: str
    layout: KVLayout
    chunks: np.ndarray
    expected: np.ndarray

    @property
    def n(self) -> int:
        return len(self.chunks)

    @property
    def s(self) -> int:
        return self.layout.per_layer_chunk_bytes

    @property
    def layers(self) -> int:
        return self.layout.num_layers

    def chunk_keys(self) -> list[str]:
        return [f"{self.tag}/{j}" for j in range(self.n)]

    def slice_keys(self, layer: int) -> list[str]:
        return [f"{self.tag}/{layer}/{j}" for j in range(self.n)]


def _address(a: np.ndarray) -> int:
    return a.ctypes.data


class MooncakeReader:
    """One Mooncake Store client: ``same_host`` (a dummy client of ``mooncake_client``, shared memory) or TCP."""

    def __init__(self, mc: Mooncake, max_payload: int, same_host: bool) -> None:
        from mooncake.store import MooncakeDistributedStore

        self.store = MooncakeDistributedStore()
        self.same_host = same_host
        self.staging: np.ndarray | None = None  # TCP: whole chunks land here, then are scattered into dest
        if same_host:
            if self.store.setup_dummy(max_payload + (16 << 20), 16 << 20, mc.client_address) != 0:
                raise PeerUnavailable("Mooncake's same-host client could not attach to mooncake_client")
            ptr = self.store.alloc_from_mem_pool(max_payload)
            if not ptr or self.store.register_buffer(ptr, max_payload) != 0:
                raise PeerUnavailable("Mooncake's shared memory pool gave no destination buffer")
            self.dest = np.ctypeslib.as_array((ctypes.c_uint8 * max_payload).from_address(ptr))
        else:
            config = {"local_hostname": "127.0.0.1", "metadata_server": mc.metadata, "global_segment_size": 0, "local_buffer_size": 64 << 20,
                      "protocol": "tcp", "rdma_devices": "", "master_server_addr": mc.master}
            if self.store.setup(config) != 0:
                raise PeerUnavailable("Mooncake's TCP client setup failed (see mooncake_master's log)")
            self.dest = np.empty(max_payload, np.uint8)
            if self.store.register_buffer(_address(self.dest), max_payload) != 0:
                raise PeerUnavailable("Mooncake's TCP client could not register its destination buffer")

    def load(self, case: Case) -> None:
        """Every chunk as one object (``{tag}/{chunk}``, all layers), from registered memory."""
        src = case.chunks
        if self.store.register_buffer(_address(src), src.nbytes) != 0:
            raise RuntimeError("Mooncake: could not register the source chunks")
        try:
            keys = case.chunk_keys()
            for first in range(0, case.n, MOONCAKE_PUT_BATCH):
                js = range(first, min(first + MOONCAKE_PUT_BATCH, case.n))
                codes = self.store.batch_put_from([keys[j] for j in js], [_address(src[j]) for j in js], [src.shape[1]] * len(js))
                if any(c != 0 for c in codes):
                    raise RuntimeError(f"Mooncake put failed: {sorted(set(codes))} (is the segment large enough?)")
        finally:
            self.store.unregister_buffer(_address(src))

    def read(self, case: Case, dest: np.ndarray) -> float | None:
        return self._read_same_host(case, dest) if self.same_host else self._read_tcp(case, dest)

    def _read_tcp(self, case: Case, dest: np.ndarray) -> None:
        """Whole chunks (one slice each: the TCP transport pays per slice) into a registered staging buffer
        with ``batch_get_into``, ≤ 16 MiB a batch, each batch scattered into ``dest``'s layer slots."""
        keys, chunk = case.chunk_keys(), case.layers * case.s
        if self.staging is None or self.staging.nbytes < chunk:
            if self.staging is not None:
                self.store.unregister_buffer(_address(self.staging))
            self.staging = np.empty(max(MOONCAKE_TCP_BATCH_BYTES, chunk), np.uint8)
            if self.store.register_buffer(_address(self.staging), self.staging.nbytes) != 0:
                raise RuntimeError("Mooncake: could not register the staging buffer")
        view, base, step = dest.reshape(case.layers, case.n, case.s), _address(self.staging), self.staging.nbytes // chunk
        for first in range(0, case.n, step):
            k = min(step, case.n - first)
            got = self.store.batch_get_into(keys[first:first + k], [base + i * chunk for i in range(k)], [chunk] * k)
            if any(g != chunk for g in got):
                raise RuntimeError(f"Mooncake batch_get_into returned {sorted(set(got))}, not {chunk} bytes each")
            view[:, first:first + k, :] = self.staging[: k * chunk].reshape(k, case.layers, case.s).transpose(1, 0, 2)
        return None

    def _read_same_host(self, case: Case, dest: np.ndarray) -> None:
        """``batch_get_into_multi_buffers``: each chunk's layer slices straight into their slots of ``dest``."""
        keys, base, layer_bytes = case.chunk_keys(), _address(dest), case.n * case.s
        ptrs = [[base + layer * layer_bytes + j * case.s for layer in range(case.layers)] for j in range(case.n)]
        got = self.store.batch_get_into_multi_buffers(keys, ptrs, [[case.s] * case.layers] * case.n)
        if any(g != case.layers * case.s for g in got):
            raise RuntimeError(f"Mooncake batch_get_into_multi_buffers returned {sorted(set(got))}, not {case.layers * case.s} bytes each")
        return None  # one object per chunk: layer 0 is complete with the last chunk

    def clear(self) -> None:
        self.store.remove_all(force=True)  # nothing reads them any more: no need to wait out their leases

    def close(self) -> None:
        self.store.close()


class RedisReader:
    def __init__(self, server: Redis) -> None:
        import redis

        self.r = redis.Redis(host="127.0.0.1", port=server.port)
        self.r.ping()

    def load(self, case: Case) -> None:
        view = case.chunks.reshape(case.n, case.layers, case.s)
        for layer in range(case.layers):
            pipe = self.r.pipeline(transaction=False)
            for j, key in enumerate(case.slice_keys(layer)):
                pipe.set(key, view[j, layer].tobytes())
            pipe.execute()

    def read(self, case: Case, dest: np.ndarray) -> float:
        t, first = time.perf_counter(), 0.0
        layers = dest.reshape(case.layers, -1)
        for layer in range(case.layers):
            values = self.r.mget(case.slice_keys(layer))
            if any(v is None or len(v) != case.s for v in values):
                raise RuntimeError("Redis MGET missed a key or returned a short value")
            layers[layer] = np.frombuffer(b"".join(values), np.uint8)
            if layer == 0:
                first = time.perf_counter() - t
        return first

    def clear(self) -> None:
        self.r.flushall()

    def close(self) -> None:
        self.r.close()


class LMCacheReader:
    """LMCache's remote-server protocol (``lmcache.v1.protocol``) over one connection, one request at a time."""

    def __init__(self, server: LMCacheServer) -> None:
        import torch
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.protocol import ClientCommand, ClientMetaMessage, ServerMetaMessage, ServerReturnCode

        self._torch, self._key, self._fmt = torch, CacheEngineKey, MemoryFormat.BINARY
        self._cmd, self._meta, self._reply, self._ok = ClientCommand, ClientMetaMessage, ServerMetaMessage, ServerReturnCode.SUCCESS
        self.sock = socket.create_connection(("127.0.0.1", server.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._case_ids: dict[str, int] = {}

    def _header(self, command, case: Case, j: int, length: int) -> bytes:
        case_id = self._case_ids.setdefault(case.tag, len(self._case_ids))
        key = self._key.from_string(f"objectcache-bench@1@0@{case_id * 1_000_000 + j}@bfloat16")
        return self._meta(command, key, length, self._fmt, self._torch.uint8, self._torch.Size([length, 0, 0, 0])).serialize()

    def _recv_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            k = self.sock.recv_into(view[got:])
            if not k:
                raise RuntimeError("LMCache server closed the connection")
            got += k

    def _reply_meta(self):
        head = bytearray(self._reply.packlength())
        self._recv_into(memoryview(head))
        return self._reply.deserialize(bytes(head))

    def load(self, case: Case) -> None:
        for j in range(case.n):
            self.sock.sendall(self._header(self._cmd.PUT, case, j, case.chunks[j].nbytes))
            self.sock.sendall(case.chunks[j].data)
        # PUT has no reply; the server handles a connection's requests in order, so this EXIST answers after the last one.
        self.sock.sendall(self._header(self._cmd.EXIST, case, case.n - 1, 0))
        if self._reply_meta().code != self._ok:
            raise RuntimeError("LMCache server did not keep the chunks")

    def read(self, case: Case, dest: np.ndarray) -> float | None:
        view = dest.reshape(case.layers, case.n, case.s)
        chunk = np.empty(case.layers * case.s, np.uint8)
        for j in range(case.n):
            self.sock.sendall(self._header(self._cmd.GET, case, j, 0))
            meta = self._reply_meta()
            if meta.code != self._ok or meta.length != chunk.nbytes:
                raise RuntimeError(f"LMCache GET of chunk {j}: code {meta.code}, {meta.length} bytes")
            self._recv_into(memoryview(chunk))
            view[:, j, :] = chunk.reshape(case.layers, case.s)
        return None  # chunk-major: layer 0 is complete only with the last chunk

    def clear(self) -> None:
        pass  # the server has no delete: each case's keys are its own

    def close(self) -> None:
        self.sock.close()
