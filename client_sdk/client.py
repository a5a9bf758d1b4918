"""``ObjectCacheClient``: what serving code imports to store, look up and load prefix KV cache.

Plain S3 calls go through aiobotocore; the KV extension requests (``kv-put``,
``kv-lookup``, ``kv-get``, ``kv-register``) are signed with the same SigV4
signer (botocore's) and sent with aiohttp, because their bodies and the
frame-stream responses are not part of the S3 API model.

The class is put together from parts of one job each: :mod:`.signed` (signing, sending and
retrying the extension requests), :mod:`.registration` (the registration callbacks),
:mod:`.kv_get` (``fetch_layers``/``fetch``) and :mod:`.rdma_get` (S3-over-RDMA GETs);
this module holds its life cycle, puts, lookups and status.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import numpy as np
from aiobotocore.session import get_session
from botocore.auth import SigV4Auth
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from protocol.errors import ErrorCode, S3Error
from protocol.estimate import EstimateReply, EstimateRequest
from protocol.kv_http import HEADER_LOAD_BUDGET, HEADER_SOFT_PIN_TTL, KVOp, LoadBudget, LookupReply, UnregisterRequest
from protocol.pyverbs_device import PyverbsDevice, verbs_available
from protocol.verbs import ENGINE, VerbsDevice
from protocol.wire import TransportKind, encode_keys, encode_put_batch

from .compression import encode_layout_chunk, shape_header
from .decoding import SliceDecoder
from .destinations import Destinations, HttpDestinations, ShmDestinations
from .kv_get import KVGets
from .layout import KVLayout
from .local_session import FastPathUnavailable, LocalSession
from .rdma import RdmaDestinations, rdma_available
from .rdma_get import RdmaGets
from .registration import Registrations
from .s3_errors import S3_CALL_ERRORS, client_error_code, from_botocore
from .signed import MAX_BACKOFF_S, UNSIGNED_PAYLOAD, _json, _s3_error, _unreachable
from .verbs import VerbsDestinations

__all__ = ["MAX_BACKOFF_S", "PUT_BATCH_BYTES", "UNSIGNED_PAYLOAD", "ObjectCacheClient"]

PUT_BATCH_BYTES = 64 << 20


class ObjectCacheClient(KVGets, RdmaGets, Registrations):
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
        self._unregistering: set[asyncio.Task[None]] = set()  # regions of abandoned fetches, being let go of
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
        if self._local is not None:
            self._local.close_idle()
        if self._unregistering:
            await asyncio.gather(*self._unregistering, return_exceptions=True)
        for r in [r for d in self._destinations.values() for r in d.close()]:
            await self._unregister(r)
        if self._s3_ctx is not None:
            await self._s3_ctx.__aexit__(None, None, None)
            self._s3_ctx = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        await asyncio.to_thread(self._decoder.close)

    async def _unregister(self, r: Any) -> None:
        with contextlib.suppress(Exception):  # best effort, as it always was at close
            await self._post("/", KVOp.UNREGISTER, _json(UnregisterRequest(r.region_id.hex(), r.token.hex())))

    def _unregister_soon(self, r: Any) -> None:
        """Unregister ``r`` (an abandoned fetch's region) without holding up the fetch that let go of it (the node lets go
        of its memory once the transfer that still writes into it stops)."""
        task = asyncio.ensure_future(self._unregister(r))
        self._unregistering.add(task)
        task.add_done_callback(self._unregistering.discard)

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
