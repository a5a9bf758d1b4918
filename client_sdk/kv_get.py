"""kv-get on the client: build the descriptor, open the frame stream (through the gateway, from the storage
server's data endpoint it grants, or over the local fast path), retry it until the response begins, resume it
from the node when a peer's stream of it breaks, and hand the caller a :class:`LayerStream`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp
import numpy as np

from protocol.data_ticket import GRANT_CONTENT_TYPE, HEADER_DIRECT, DirectGrant
from protocol.errors import ErrorCode, S3Error
from protocol.kv_http import HEADER_RDMA_TAG, KVOp
from protocol.wire import Descriptor, Mode, TransportKind, encode_descriptor

from .decoding import LayerDecodes, SliceDecoder
from .destinations import Destination, Destinations
from .direct import DirectFrameStream
from .frames import FrameStream
from .layout import KVLayout
from .local_session import FastPathUnavailable, LocalSession, NoResponse
from .signed import SignedRequests, _unreachable, log
from .stream import FetchStats, LayerStream, budget_exceeded

T = TypeVar("T")
# This process gives up on a load this long before its budget runs out: closing the stream and the caller's switch to its
# recompute take about that on a busy host (0.8 ms at load average 5), and the recompute must start within the budget.
BUDGET_REACTION_S = 0.002


class KVGets(SignedRequests):
    """``fetch_layers`` / ``fetch`` and the transport choice behind them."""

    bucket: str
    direct: bool
    link_gbps: float
    _decoder: SliceDecoder
    _local: LocalSession | None
    _destinations: dict[TransportKind, Destinations]
    _rdma_unavailable: str
    _unregister_soon: Callable[[Any], None]

    @contextlib.asynccontextmanager
    async def fetch_layers(self, keys: Sequence[str], layout: KVLayout, transport: str = "auto", *,
                           compute_window: float | Sequence[float] | None = None, mode: str = "auto",
                           out: Any = None, verify: bool | None = None, load_budget_s: float = 0.0,
                           decode: str = "auto") -> AsyncIterator[LayerStream]:
        """Load the layer-major payload of ``keys``; iterate layers as they land.

        ``transport``: ``"shm"`` (same host: the server writes into a registered
        shared-memory region), ``"http"`` (anywhere: bytes in the response, or
        from the storage server's data endpoint when it has one, see ``direct``) or
        ``"auto"`` (shm when the endpoint is on this host). ``compute_window``
        is the per-layer compute time of the request's miss tokens (seconds),
        which the server's bandwidth allocator uses. ``out`` (http and rdma) is
        memory of at least ``N·L·S`` bytes to fill instead of the SDK's own: any
        writable buffer-protocol object (numpy, bytearray, mmap) or CPU torch
        tensor; over rdma it is registered on first use and reused whenever the
        same memory is passed again.
        ``verify`` checks each layer's CRC32C; by default it does over ``http``
        (the bytes crossed sockets) and not over ``shm``, where the server
        writes the very pages this process reads. When not verifying, the
        descriptor tells the server not to compute the CRCs at all: a pass
        over every byte that nobody would read.
        ``load_budget_s`` (0: none): the storage server ends a layerwise
        transfer with ``KVLoadBudgetExceeded`` at the first layer it expects to
        start later than this after it received the kv-get (the layers before
        it are delivered); the caller recomputes the rest. This process raises
        the same error itself when a layer is not in place that long after this
        call (the node's clock starts only once the request has reached it: on a
        busy host the request path alone took tens of milliseconds).
        ``decode``: where compressed chunks are decoded, ``"node"`` (the node writes raw layers),
        ``"client"`` (http and rdma: the node sends them as stored, fewer bytes on the link, and this
        process decodes them on its own bounded pool, ``decode_threads``) or ``"auto"`` (over http and
        rdma the node picks per kv-get from the link rate — its bandwidth pool's grant, else ``link_gbps`` —
        and both sides' measured decode rates, ``storage_server.decode_choice``; shm: the node).
        """
        if decode not in ("auto", "node", "client"):
            raise ValueError(f"decode must be 'auto', 'node' or 'client', not {decode!r}")
        keys = list(keys)
        if not keys:
            raise ValueError("fetch_layers needs at least one key")
        kind = self._transport_kind(transport)
        payload_bytes = layout.payload_bytes(len(keys))
        window: tuple[float, ...] = () if compute_window is None else (
            (float(compute_window),) if isinstance(compute_window, (int, float)) else tuple(float(w) for w in compute_window))
        mode_v = {"auto": Mode.AUTO, "chunkwise": Mode.CHUNKWISE, "layerwise": Mode.LAYERWISE}[mode]
        destinations = self._destinations[kind]
        check = destinations.verify_by_default if verify is None else verify
        started = time.perf_counter()
        deadline = started + load_budget_s - min(BUDGET_REACTION_S, load_budget_s / 2) if load_budget_s > 0 else None
        resp = None
        frames: FrameStream | DirectFrameStream | None = None
        opened: list[tuple[Any, FrameStream | DirectFrameStream]] = []  # every stream this kv-get read (a resumed one has several)
        dest: Destination | None = None
        stream: LayerStream | None = None
        refused = True  # until a request is sent: the server answered it with an error (it wrote nothing)
        auto = decode == "auto" and kind in (TransportKind.HTTP, TransportKind.RDMA)
        decodes = LayerDecodes(self._decoder, layout.per_layer_chunk_bytes) if decode == "client" or auto else None

        unreachable: list[str] = []  # peers a grant named whose data endpoint did not answer: the kv-get was asked again

        def count_unreachable(stats: FetchStats) -> None:
            for path in unreachable:
                stats.failovers += 1
                stats.broken_paths.setdefault(path, 0)  # no layer of it had arrived
            unreachable.clear()

        async def resume(first_layer: int) -> tuple[Any, FrameStream | DirectFrameStream]:
            """The layers from ``first_layer`` on, asked again of this client's node (a peer's stream of them broke)."""
            again = dataclasses.replace(descriptor, first_layer=first_layer)
            opened.append(await self._retrying(f"kv-get of {len(keys)} chunk(s) from layer {first_layer}",
                                               lambda: self._open_frames(kind, again, unreachable)))
            count_unreachable(stream.stats)
            return opened[-1]

        try:
            for attempt in (1, 2):
                dest = await destinations.acquire(payload_bytes, out)
                descriptor = Descriptor(keys, layout.num_layers, layout.chunk_tokens, layout.per_layer_chunk_bytes, dest.target, window, mode_v,
                                        layer_checksums=check, load_budget_s=load_budget_s, client_decodes=decode == "client",
                                        decode_auto=auto, client_decode_workers=self._decoder.threads if auto else 0,
                                        client_decode_bytes_per_s=self._decoder.bytes_per_s_per_core if auto else 0.0,
                                        client_link_bytes_per_s=self.link_gbps * 1e9 / 8 if auto else 0.0)
                try:
                    # Retried only until the response begins: no byte of the payload has moved before that.
                    opening = self._retrying(f"kv-get of {len(keys)} chunk(s)", lambda: self._open_frames(kind, descriptor, unreachable))
                    refused = False
                    resp, frames = await (opening if deadline is None else _by(deadline, load_budget_s, opening))
                    break
                except S3Error as e:
                    # The node's answer (not this process's deadline or read timeout): nothing was started.
                    refused = e.code not in (ErrorCode.KVLoadBudgetExceeded, ErrorCode.RequestTimeout)
                    if e.code != ErrorCode.KVNoSuchRegion or attempt == 2:
                        raise
                    # The storage server restarted and forgot our region (and so every other): register afresh, retry once.
                    destinations.forget(dest)
                    destinations.forget_idle()
                    dest = None
            assert resp is not None and dest is not None and frames is not None
            opened.append((resp, frames))
            landed = destinations.layer_waiter(dest, int(resp.headers.get(HEADER_RDMA_TAG, "0")))
            stream = LayerStream(frames, resp, dest.view, layout.per_layer_chunk_bytes * len(keys), layout.num_layers, kind.name.lower(), check,
                                 started, landed, decodes, layout.per_layer_chunk_bytes, resume, deadline)
            count_unreachable(stream.stats)
            yield stream
            # Leaving early abandons the transfer: closing the connection stops the server.
            if not stream._done:
                opened[-1][0].close()
        finally:
            if frames is not None and not opened:
                opened.append((resp, frames))
            for r, f in opened:
                if isinstance(f, DirectFrameStream):
                    # A session connection whose kv-get ended (END or ERROR read) serves the next one; any other closes.
                    if f.keep is not None and stream is not None and stream.ended and f is opened[-1][1]:
                        f.keep(f)
                    else:
                        f.close()
                if r is not None:
                    r.release()
            if decodes is not None:
                await decodes.drain()  # no decode thread still writes into the destination once it is released
            # Left before the server's end (its END or ERROR frame, or its refusal of the request): it may still write
            # into the destination, which another fetch must not get (a client-side deadline or a cancel while the
            # request was opening counts: the server may have accepted it).
            if dest is not None and (stream.ended if stream is not None else refused):
                destinations.release(dest)
            elif dest is not None:
                for region in destinations.abandon(dest):
                    self._unregister_soon(region)

    async def _open_frames(self, kind: TransportKind, descriptor: Descriptor, unreachable: list[str] | None = None) -> tuple[Any, FrameStream | DirectFrameStream]:
        """Send the signed kv-get; its frames come in the response, or from the data endpoint it grants a ticket for
        (shm with ``local_session``: the kv-get goes to the session socket, unsigned, with the session's capability).
        A peer's data endpoint that does not answer (the peer died or stalled after its node granted it) raises
        ServiceUnavailable, so the caller's retry asks the node again (which no longer finds that peer), and is
        added to ``unreachable`` as ``peer:<id>``."""
        if self._local is not None and kind == TransportKind.SHM and self._local.available():
            try:
                return NoResponse(), await self._local.open(descriptor)
            except FastPathUnavailable as e:
                log.info("kv-get through the gateway: %s", e)
        body = encode_descriptor(descriptor)
        direct = self.direct and kind == TransportKind.HTTP
        resp = await self._post(f"/{self.bucket}", KVOp.GET, body, stream=True, extra_headers={HEADER_DIRECT: "1"} if direct else None)
        if resp.content_type != GRANT_CONTENT_TYPE:
            return resp, FrameStream(resp.content)
        try:
            grant = DirectGrant.from_json(json.loads(await resp.read()))
        except (aiohttp.ClientError, ValueError) as e:
            resp.release()
            raise _unreachable(self.endpoint, "?kv-get", e) from None
        resp.release()
        try:
            return resp, await DirectFrameStream.open(grant, body, self._timeout.sock_read or 120.0)
        except S3Error as e:
            e.resource = e.resource or f"/{self.bucket}"  # as the gateway's error response would name it
            if grant.peer and e.code is ErrorCode.ServiceUnavailable and unreachable is not None:
                unreachable.append(f"peer:{grant.peer}")
            raise

    async def fetch(self, keys: Sequence[str], layout: KVLayout, transport: str = "auto", **kw: Any) -> tuple[np.ndarray, FetchStats]:
        """Load everything and return a copy of the payload as ``(L, N·S)`` uint8 plus stats."""
        async with self.fetch_layers(keys, layout, transport, **kw) as layers:
            async for _ in layers:
                pass
            arr = np.frombuffer(layers.payload, dtype=np.uint8).reshape(layout.num_layers, -1).copy()
            return arr, layers.stats

    def _transport_kind(self, transport: str) -> TransportKind:
        """``auto``: shm on the same host, rdma where this process has an RDMA engine, http otherwise."""
        if transport == "auto":
            host = self.endpoint.split("//", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
            if host in ("127.0.0.1", "localhost", "::1", "[::1]") and hasattr(os, "memfd_create"):
                return TransportKind.SHM
            return TransportKind.RDMA if TransportKind.RDMA in self._destinations else TransportKind.HTTP
        kind = TransportKind.__members__.get(transport.upper()) if transport.islower() else None
        if kind == TransportKind.RDMA and kind not in self._destinations:
            raise ValueError(f"transport 'rdma' is not available in this process: {self._rdma_unavailable}")
        if kind not in self._destinations:
            raise ValueError(f"transport must be one of {', '.join(sorted(k.name.lower() for k in self._destinations))} or 'auto', not {transport!r}")
        return kind


async def _by(deadline: float, budget_s: float, opening: Awaitable[T]) -> T:
    """``opening`` (the kv-get's request), given up with ``KVLoadBudgetExceeded`` at ``deadline`` (perf_counter)."""
    try:
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + deadline - time.perf_counter()):
            return await opening
    except TimeoutError:
        raise budget_exceeded(0, budget_s) from None
