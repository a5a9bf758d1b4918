"""``ObjectCacheClient``: what serving code imports to store, look up and load prefix KV cache.

Plain S3 calls go through aiobotocore; the KV extension requests (``kv-put``,
``kv-lookup``, ``kv-get``, ``kv-register``) are signed with the same SigV4
signer (botocore's) and sent with aiohttp, because their bodies and the
frame-stream responses are not part of the S3 API model.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import numpy as np
from aiobotocore.session import get_session
from awscrt.checksums import crc32c
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from protocol.checksums import b64
from protocol.data_ticket import GRANT_CONTENT_TYPE, HEADER_DIRECT, DirectGrant
from protocol.errors import ErrorCode, S3Error
from protocol.estimate import EstimateReply, EstimateRequest
from protocol.kv_http import HEADER_LOAD_BUDGET, HEADER_RDMA_TAG, HEADER_SOFT_PIN_TTL, KVOp, LoadBudget, LookupReply, RdmaRegisterRequest, RegisterReply, RegisterTicket, UnregisterRequest
from protocol.pyverbs_device import PyverbsDevice, verbs_available
from protocol.rdma_token import HEADER_RDMA_BYTES, HEADER_RDMA_REPLY, HEADER_RDMA_TOKEN, REPLY_OK
from protocol.session import SessionTicket
from protocol.verbs import ENGINE, VerbsDevice
from protocol.wire import Descriptor, Mode, TransportKind, encode_descriptor, encode_keys, encode_put_batch

from .buffers import ShmRegion, hand_over
from .compression import encode_layout_chunk, shape_header
from .decoding import LayerDecodes, SliceDecoder
from .destinations import Destination, Destinations, HttpDestinations, ShmDestinations
from .direct import DirectFrameStream
from .frames import FrameStream
from .layout import KVLayout
from .local_session import FastPathUnavailable, LocalSession, NoResponse
from .rdma import RdmaDestinations, rdma_available
from .s3_errors import S3_CALL_ERRORS, client_error_code, from_botocore
from .stream import FetchStats, LayerStream
from .verbs import VerbsDestinations

PUT_BATCH_BYTES = 64 << 20
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Retries of idempotent calls wait backoff, 2·backoff, 4·backoff, ... (±25% jitter), each at most this long.
MAX_BACKOFF_S = 2.0

log = logging.getLogger("objectcache.client")
T = TypeVar("T")


def _unreachable(endpoint: str, what: str, e: BaseException) -> S3Error:
    """A refused, reset or dropped connection as the SDK's own error (never a raw aiohttp exception)."""
    return S3Error(ErrorCode.ServiceUnavailable, f"{what}: the connection to the gateway at {endpoint} failed ({type(e).__name__}: {e})")


def _s3_error(status: int, body: bytes) -> S3Error:
    try:
        doc = ET.fromstring(body)
        code = ErrorCode.__members__.get(doc.findtext("Code") or "", ErrorCode.InternalError)
        extra = {c.tag: c.text or "" for c in doc if c.tag not in ("Code", "Message", "Resource", "RequestId")}
        return S3Error(code, doc.findtext("Message") or "", doc.findtext("Resource") or "", extra)
    except ET.ParseError:
        return S3Error(ErrorCode.InternalError, f"HTTP {status}: {body[:200]!r}")


def _json(record: Any) -> bytes:
    return json.dumps(record.to_json()).encode()


class ObjectCacheClient:
    """Async client. Use as ``async with ObjectCacheClient(...) as c:``.

    ``read_timeout`` bounds the silence between two reads of a response (a
    stalled server), not a whole transfer: a paced kv-get stream may rightly
    run for minutes. Exceeding it raises ``RequestTimeout``.

    Idempotent calls (``lookup``, ``estimate``, ``put_chunks`` — chunks are immutable —,
    ``status``, and ``fetch``/``fetch_layers`` until the response has begun)
    are retried ``retries`` times when the gateway answers 503 or the
    connection is refused, reset or dropped (a gateway restart), waiting
    ``backoff`` seconds, then twice that, and so on (at most 2 s each); then
    they raise ``ObjectCacheError`` (``ServiceUnavailable``) saying what failed.
    A stream that breaks after it began is never retried silently. Every
    failure is an ``ObjectCacheError``, never a raw aiohttp exception.

    ``shm_prefault_bytes`` (0: off) runs :meth:`warm_up` for payloads of that
    size when the client opens, so the first shm fetch finds its region ready.

    ``direct`` (http fetches): ask the gateway for a ticket to the storage
    server's data endpoint and read the frames from there, when the server has
    one (``storage_server.data_listen``); otherwise, or with ``direct=False``,
    the gateway relays them.

    ``local_session`` (shm fetches): register one session of the local fast path
    (:mod:`protocol.session`) with a signed request, then send each kv-get straight to
    the storage server's session socket, without HTTP, SigV4 or the gateway. ``None``
    (the default): do so where the node offers it, else (its fast path is off, the
    gateway predates it, its socket is out of reach) send kv-gets through the gateway,
    with the same checks; ``True``: only the fast path (its errors raise); ``False``:
    always the gateway.

    ``rdma_engine`` must match the storage server's ``storage_server.rdma_engine``:
    ``"nixl"`` (NIXL over UCX) or ``"pyverbs"`` (rdma-core's verbs; ``open_verbs``
    opens the device, the first one by default).

    ``decode_threads``: the pool that decodes compressed chunks sent as stored (``fetch_layers(decode=)``);
    ``link_gbps`` (0: unknown): the link rate to the node, which ``decode="auto"`` states to the node so it
    can choose the decode site when its bandwidth pool does not pace the transfer.
    """

    def __init__(self, endpoint: str, access_key: str, secret_key: str, bucket: str, region: str = "us-east-1",
                 max_connections: int = 64, read_timeout: float = 120.0, retries: int = 3, backoff: float = 0.1,
                 shm_prefault_bytes: int = 0, direct: bool = True, rdma_engine: str = "nixl",
                 open_verbs: Callable[[], VerbsDevice] | None = None, local_session: bool | None = None,
                 decode_threads: int = 2, link_gbps: float = 0.0) -> None:
        if retries < 0 or backoff < 0:
            raise ValueError("retries and backoff must be >= 0")
        self.endpoint = endpoint.rstrip("/")
        self.bucket = bucket
        self.region = region
        self.retries = retries
        self.backoff = backoff
        self.shm_prefault_bytes = shm_prefault_bytes
        self.direct = direct
        if decode_threads < 1:
            raise ValueError("decode_threads must be at least 1")
        self._decoder = SliceDecoder(decode_threads)  # fetch_layers(decode="client"/"auto"): compressed slices decoded here
        if not (link_gbps >= 0 and math.isfinite(link_gbps)):
            raise ValueError(f"link_gbps must be finite and >= 0, not {link_gbps!r}")
        self.link_gbps = link_gbps  # decode="auto": the link rate to the node, as declared (0: unknown)
        self._credentials = Credentials(access_key, secret_key)
        self._signer = SigV4Auth(self._credentials, "s3", region)
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_timeout)
        self._http: aiohttp.ClientSession | None = None
        self._local = None if local_session is False else LocalSession(self._register_session, read_timeout, optional=local_session is None)
        self._s3_ctx = None
        self.s3: Any = None  # aiobotocore S3 client for plain S3 calls
        self._destinations: dict[TransportKind, Destinations] = {
            d.kind: d for d in (HttpDestinations(), ShmDestinations(self._register_region))
        }
        if rdma_engine not in ("nixl", ENGINE):
            raise ValueError(f"rdma_engine must be 'nixl' or {ENGINE!r} (the storage server's storage_server.rdma_engine), not {rdma_engine!r}")
        if rdma_engine == ENGINE:
            available, self._rdma_unavailable = (True, "") if open_verbs is not None else verbs_available()
            opener = open_verbs or PyverbsDevice
            rdma: Destinations = VerbsDestinations(self._register_verbs, opener)
        else:
            available, self._rdma_unavailable = rdma_available()
            rdma = RdmaDestinations(self._register_rdma)
        if available:
            self._destinations[TransportKind.RDMA] = rdma

    async def __aenter__(self) -> "ObjectCacheClient":
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self._max_connections), auto_decompress=False,
                                           timeout=self._timeout)
        session = get_session()
        self._s3_ctx = session.create_client(
            "s3", endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=self._credentials.access_key, aws_secret_access_key=self._credentials.secret_key,
            config=BotoConfig(s3={"addressing_style": "path"}, max_pool_connections=self._max_connections),
        )
        self.s3 = await self._s3_ctx.__aenter__()
        if self.shm_prefault_bytes > 0:
            try:
                await self.warm_up(self.shm_prefault_bytes)
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for r in [r for d in self._destinations.values() for r in d.close()]:
            with contextlib.suppress(Exception):
                await self._post("/", KVOp.UNREGISTER, _json(UnregisterRequest(r.region_id.hex(), r.token.hex())))
        if self._s3_ctx is not None:
            await self._s3_ctx.__aexit__(None, None, None)
            self._s3_ctx = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        await asyncio.to_thread(self._decoder.close)

    # -- signed extension requests ------------------------------------------------
    def _signed_headers(self, method: str, url: str, payload_hash: str, extra: dict[str, str]) -> dict[str, str]:
        req = AWSRequest(method=method, url=url, headers={"X-Amz-Content-SHA256": payload_hash, **extra})
        self._signer.add_auth(req)
        return dict(req.headers.items())

    async def _post(self, path: str, op: KVOp, body: bytes | list, *, payload_hash: str | None = None,
                    extra_headers: dict[str, str] | None = None, stream: bool = False) -> aiohttp.ClientResponse:
        """POST ``path?op`` signed with SigV4. List bodies are sent without joining (KV batches)."""
        assert self._http is not None, "use the client inside `async with`"
        url = f"{self.endpoint}{path}?{op}"
        if isinstance(body, list):
            length = sum(memoryview(p).nbytes for p in body)
            crc = 0
            for p in body:
                crc = crc32c(p, crc)
            headers = self._signed_headers("POST", url, UNSIGNED_PAYLOAD, {"x-amz-checksum-crc32c": b64(crc.to_bytes(4, "big")), **(extra_headers or {})})
            headers["Content-Length"] = str(length)

            async def gen():
                for p in body:
                    yield p

            data: Any = gen()
        else:
            headers = self._signed_headers("POST", url, payload_hash or hashlib.sha256(body).hexdigest(), extra_headers or {})
            data = body
        try:
            resp = await self._http.post(url, data=data, headers=headers)
            if resp.status != 200:
                text = await resp.read()
                resp.release()
                raise _s3_error(resp.status, text)
            if not stream:
                await resp.read()
        except asyncio.TimeoutError:
            raise S3Error(ErrorCode.RequestTimeout, f"no response to ?{op} within {self._timeout.sock_read:.0f} s (read_timeout)") from None
        except aiohttp.ClientError as e:
            raise _unreachable(self.endpoint, f"?{op}", e) from None
        return resp

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run an idempotent ``call``; on 503 or a failed connection, retry with bounded exponential backoff."""
        started = time.monotonic()
        for attempt in range(self.retries + 1):
            try:
                return await call()
            except S3Error as e:
                if e.code is not ErrorCode.ServiceUnavailable:
                    raise
                if attempt == self.retries:
                    raise S3Error(ErrorCode.ServiceUnavailable, f"{what} failed after {attempt + 1} attempt(s) over "
                                  f"{time.monotonic() - started:.1f} s: {e.message}", e.resource, e.extra) from None
                delay = min(self.backoff * 2 ** attempt, MAX_BACKOFF_S) * random.uniform(0.75, 1.25)
                log.info("%s: %s; retry %d of %d in %.2f s", what, e.message, attempt + 1, self.retries, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _register_region(self, region: ShmRegion) -> tuple[bytes, bytes]:
        """Ask for a ticket (signed), then hand the memfd over on this host (:mod:`protocol.shm`)."""
        # populate only when asked, so a server that predates the field still takes plain registrations.
        request = {"size": region.size} | ({"populate": True} if region.prefaulted else {})
        resp = await self._retrying("kv-register", lambda: self._post("/", KVOp.REGISTER, json.dumps(request).encode()))
        ticket = RegisterTicket.from_json(await resp.json())
        assert region.fd is not None
        reply = RegisterReply.from_json(await asyncio.to_thread(hand_over, ticket.socket, bytes.fromhex(ticket.ticket), region.fd))
        return bytes.fromhex(reply.region_id), bytes.fromhex(reply.token)

    async def _register_session(self) -> SessionTicket:
        """The signed half of a local fast-path session (then bound on the session socket by :class:`LocalSession`)."""
        resp = await self._retrying("kv-session", lambda: self._post(f"/{self.bucket}", KVOp.SESSION, b""))
        return SessionTicket.from_json(await resp.json())

    async def _register_rdma(self, metadata: bytes, addr: int, size: int, proof: bytes) -> tuple[bytes, bytes]:
        """Tell the storage server about memory registered with this process's NIXL agent (``proof``: its first bytes)."""
        reply = await self._register_verbs(RdmaRegisterRequest("nixl", addr, size, agent=base64.b64encode(metadata).decode(),
                                                               proof=proof.hex()))
        return bytes.fromhex(reply.region_id), bytes.fromhex(reply.token)

    async def _register_verbs(self, body: RdmaRegisterRequest) -> RegisterReply:
        """kv-register-rdma: memory this process registered with its RDMA engine (and, pyverbs, its queue pair)."""
        resp = await self._post("/", KVOp.REGISTER_RDMA, _json(body))
        return RegisterReply.from_json(await resp.json())

    # -- public API -----------------------------------------------------------------
    async def warm_up(self, payload_bytes: int, regions: int = 1) -> None:
        """Take the first shm fetch's set-up off its critical path: do it now.

        Creates ``regions`` shared-memory regions (one per fetch you will run at
        once) that each fit a ``payload_bytes`` payload, registers them with the
        storage server (the hand-over round trips) and faults in every page, so
        a later ``fetch``/``fetch_layers`` over shm reuses them with none of that
        left to do; with the local fast path, its session is registered too.
        Needs the storage server on this host, like shm itself.
        """
        if payload_bytes <= 0 or regions < 1:
            raise ValueError("warm_up needs payload_bytes > 0 and regions >= 1")
        shm = self._destinations[TransportKind.SHM]
        assert isinstance(shm, ShmDestinations)
        await shm.warm_up(payload_bytes, regions)
        if self._local is not None:
            # The fast path's session too; best effort (the bucket may not exist yet): the first fetch registers it otherwise.
            with contextlib.suppress(FastPathUnavailable, S3Error):
                await self._local.prepare()

    async def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet (plain S3, through aiobotocore).

        Only a missing bucket is created; any other answer (403 for a bucket another tenant owns,
        a key that signs wrong, an outage) is raised as an ``ObjectCacheError`` naming it, never
        papered over with a create.
        """
        what = f"ensure_bucket {self.bucket!r}"
        try:
            try:
                await self.s3.head_bucket(Bucket=self.bucket)
            except ClientError as e:
                if client_error_code(e) in ("404", "NoSuchBucket", "NotFound"):
                    await self.s3.create_bucket(Bucket=self.bucket)
                elif client_error_code(e) == "403":
                    # A HEAD's 403 has no body: ask again with a GET whose error body names the cause
                    # (SignatureDoesNotMatch, InvalidAccessKeyId, AccessDenied for another tenant's bucket).
                    await self.s3.get_bucket_location(Bucket=self.bucket)
                    raise
                else:
                    raise
        except S3_CALL_ERRORS as e:
            raise from_botocore(self.endpoint, what, e) from None

    async def put_chunks(self, keys: Sequence[str], chunks: Sequence[Any], layout: KVLayout | None = None, *,
                         codec: str = "none", soft_pin_s: float = 0.0) -> int:
        """Store chunk objects (each bytes-like or ndarray of ``L·S`` bytes, KV_L2TD).

        ``soft_pin_s`` > 0 (an operator marking a hot prefix, e.g. a system prompt): the node keeps
        them cached through any eviction for that many seconds, within the tenant's
        ``cache.soft_pin_tenant_max_bytes`` (a put beyond it is refused: InvalidRequest).

        Batched into few ``kv-put`` requests. Chunks are immutable: putting
        identical bytes again is a no-op, different bytes for a stored key is
        refused. ``codec`` (``protocol.codecs``; needs ``layout``) stores each
        chunk compressed, layer by layer: kv-gets still deliver the raw layers.
        Returns how many chunks were sent.
        """
        if codec != "none" and layout is None:
            raise ValueError(f"codec {codec!r} needs the chunks' layout")
        if len(keys) != len(chunks):
            raise ValueError(f"{len(keys)} keys but {len(chunks)} chunks")
        views = []
        for key, chunk in zip(keys, chunks):
            mv = memoryview(np.ascontiguousarray(chunk) if isinstance(chunk, np.ndarray) else chunk).cast("B")
            if layout is not None and mv.nbytes != layout.chunk_bytes:
                raise ValueError(f"chunk {key!r} is {mv.nbytes} bytes, the layout says {layout.chunk_bytes}")
            if codec != "none":
                mv = memoryview(await asyncio.to_thread(encode_layout_chunk, mv, layout, codec))
            views.append((key, mv))
        headers = shape_header(layout) if layout is not None and codec == "none" else None  # the bucket's codec may apply
        if soft_pin_s:
            headers = {**(headers or {}), HEADER_SOFT_PIN_TTL: f"{soft_pin_s:g}"}
        batch: list[tuple[str, memoryview]] = []
        size = 0
        for item in views:
            batch.append(item)
            size += item[1].nbytes
            if size >= PUT_BATCH_BYTES:
                await self._put_batch(batch, headers)
                batch, size = [], 0
        if batch:
            await self._put_batch(batch, headers)
        return len(views)

    async def _put_batch(self, batch: list[tuple[str, memoryview]], headers: dict[str, str] | None = None) -> None:
        body = encode_put_batch(batch)  # a list of views: each attempt sends it afresh
        await self._retrying(f"kv-put of {len(batch)} chunk(s)", lambda: self._post(f"/{self.bucket}", KVOp.PUT, body, extra_headers=headers))

    async def lookup(self, keys: Sequence[str]) -> int:
        """How many leading keys are stored: the longest cached prefix, in chunks."""
        if not keys:
            return 0
        return (await self.lookup_within(keys)).hits

    async def lookup_within(self, keys: Sequence[str], budget: LoadBudget | None = None) -> LookupReply:
        """The longest cached prefix and, with a ``budget``, how many of its leading chunks the node expects to
        land within it (``deliverable``: its pacing and queue give the rate); load those, compute the rest."""
        if not keys:
            return LookupReply(0, 0, 0 if budget is not None else None)
        body = encode_keys(list(keys))
        headers = {HEADER_LOAD_BUDGET: budget.to_header()} if budget is not None else None
        resp = await self._retrying(f"kv-lookup of {len(keys)} key(s)",
                                    lambda: self._post(f"/{self.bucket}", KVOp.LOOKUP, body, extra_headers=headers))
        return LookupReply.from_json(await resp.json())

    async def estimate(self, keys: Sequence[str], candidates: Sequence[str], layout: KVLayout) -> EstimateReply:
        """The delivery-time oracle (``kv-estimate``, cluster nodes): per candidate host, where the prefix's leading
        chunks are warm, the path the node would use and the predicted time to the first layer and the whole payload."""
        body = _json(EstimateRequest(list(keys), list(candidates), layout.chunk_bytes, layout.num_layers).check())
        resp = await self._retrying(f"kv-estimate of {len(keys)} key(s)", lambda: self._post(f"/{self.bucket}", KVOp.ESTIMATE, body))
        return EstimateReply.from_json(await resp.json())

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
        it are delivered); the caller recomputes the rest.
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
        resp = None
        frames: FrameStream | DirectFrameStream | None = None
        opened: list[tuple[Any, FrameStream | DirectFrameStream]] = []  # every stream this kv-get read (a resumed one has several)
        dest: Destination | None = None
        auto = decode == "auto" and kind in (TransportKind.HTTP, TransportKind.RDMA)
        decodes = LayerDecodes(self._decoder) if decode == "client" or auto else None

        unreachable: list[str] = []  # peers a grant named whose data endpoint did not answer: the kv-get was asked again

        def count_unreachable(stats: FetchStats) -> None:
            for path in unreachable:
                stats.failovers += 1
                stats.broken_paths.setdefault(path, 0)  # no layer of it had arrived
            unreachable.clear()

        async def resume(first_layer: int) -> tuple[Any, FrameStream | DirectFrameStream]:
            """The layers from ``first_layer`` on, asked again of this client's node (a peer's stream of them broke)."""
            again = encode_descriptor(dataclasses.replace(descriptor, first_layer=first_layer))
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
                body = encode_descriptor(descriptor)
                try:
                    # Retried only until the response begins: no byte of the payload has moved before that.
                    resp, frames = await self._retrying(f"kv-get of {len(keys)} chunk(s)", lambda: self._open_frames(kind, body, unreachable))
                    break
                except S3Error as e:
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
                                 started, landed, decodes, layout.per_layer_chunk_bytes, resume)
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
                    f.close()
                if r is not None:
                    r.release()
            if decodes is not None:
                await decodes.drain()  # no decode thread still writes into the destination once it is released
            if dest is not None:
                destinations.release(dest)

    async def _open_frames(self, kind: TransportKind, body: bytes, unreachable: list[str] | None = None) -> tuple[Any, FrameStream | DirectFrameStream]:
        """Send the signed kv-get; its frames come in the response, or from the data endpoint it grants a ticket for
        (shm with ``local_session``: the kv-get goes to the session socket, unsigned, with the session's capability).
        A peer's data endpoint that does not answer (the peer died or stalled after its node granted it) raises
        ServiceUnavailable, so the caller's retry asks the node again (which no longer finds that peer), and is
        added to ``unreachable`` as ``peer:<id>``."""
        if self._local is not None and kind == TransportKind.SHM and self._local.available():
            try:
                return NoResponse(), await self._local.open(body)
            except FastPathUnavailable as e:
                log.info("kv-get through the gateway: %s", e)
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

    @contextlib.asynccontextmanager
    async def rdma_memory(self, nbytes: int) -> AsyncIterator[tuple[str, memoryview]]:
        """Registered memory of ``nbytes`` and the ``x-amz-rdma-token`` describing it, for plain S3 GETs.

        Any S3 client may send the token on a GET of a whole object (the S3-over-RDMA convention):
        the storage server writes the object into this memory and the response has no body. The
        memory is this client's until the block exits.
        """
        destinations = self._destinations.get(TransportKind.RDMA)
        if destinations is None:
            raise ValueError(f"transport 'rdma' is not available in this process: {self._rdma_unavailable}")
        dest = await destinations.acquire(nbytes, None)
        try:
            yield destinations.token(dest).encode(), dest.view
        finally:
            destinations.release(dest)

    async def get_object_rdma(self, key: str, bucket: str | None = None) -> np.ndarray:
        """GET a whole object over RDMA (``x-amz-rdma-token``); a copy of its bytes.

        ``NotImplemented`` when the server declines (the object no longer fits, a Range…): GET it plainly then.
        """
        assert self._http is not None, "use the client inside `async with`"
        bucket = bucket or self.bucket
        url = f"{self.endpoint}/{bucket}/{quote(key, safe='/~')}"
        try:
            async with self._http.head(url, headers=self._signed_headers("HEAD", url, hashlib.sha256(b"").hexdigest(), {})) as head:
                if head.status != 200:  # a HEAD has no error body: its status says it
                    code = {403: ErrorCode.AccessDenied, 404: ErrorCode.NoSuchKey}.get(head.status, ErrorCode.InternalError)
                    raise S3Error(code, f"HEAD {bucket}/{key}: HTTP {head.status}", f"/{bucket}/{key}")
                size = int(head.headers["Content-Length"])
        except aiohttp.ClientError as e:
            raise _unreachable(self.endpoint, f"HEAD {key}", e) from None
        async with self.rdma_memory(max(size, 1)) as (token, view):
            headers = self._signed_headers("GET", url, hashlib.sha256(b"").hexdigest(), {HEADER_RDMA_TOKEN: token})
            try:
                async with self._http.get(url, headers=headers) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise _s3_error(resp.status, body)
                    if resp.headers.get(HEADER_RDMA_REPLY) != REPLY_OK or body:
                        raise S3Error(ErrorCode.InternalError, "the server answered x-amz-rdma-token with the bytes in the body")
                    n = int(resp.headers[HEADER_RDMA_BYTES])
            except aiohttp.ClientError as e:
                raise _unreachable(self.endpoint, f"GET {key}", e) from None
            return np.frombuffer(view[:n], np.uint8).copy()

    async def status(self) -> dict:
        """This tenant's transfers in flight, registered regions and bandwidth leases."""
        assert self._http is not None
        http = self._http
        url = f"{self.endpoint}/?{KVOp.STATUS}"

        async def once() -> dict:
            headers = self._signed_headers("GET", url, hashlib.sha256(b"").hexdigest(), {})
            try:
                async with http.get(url, headers=headers) as resp:
                    if resp.status != 200:
                        raise _s3_error(resp.status, await resp.read())
                    return await resp.json()
            except asyncio.TimeoutError:
                raise S3Error(ErrorCode.RequestTimeout, f"no response to ?{KVOp.STATUS} within the read_timeout") from None
            except aiohttp.ClientError as e:
                raise _unreachable(self.endpoint, f"?{KVOp.STATUS}", e) from None

        return await self._retrying("kv-status", once)

