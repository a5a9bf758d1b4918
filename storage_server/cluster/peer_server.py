"""The peer listener: what this node does for other nodes of its cluster, and nothing for anyone else.

Four operations (:mod:`protocol.cluster`, :mod:`protocol.cluster_write`): lookup, fetch, a ticket for this node's data
endpoint (the peer -> engine path over http) and a write into another node's engine's registered memory (peer -> engine
over rdma, under a region grant besides the key grant), each refused unless the call is signed with the cluster
key, fresh and not replayed (:class:`~protocol.cluster_auth.CallVerifier`) and carries a grant for
exactly its key list (:class:`~protocol.cluster_auth.PeerGrant`). Only this node's chunk cache is
read (unless the call asks for a fill): a peer that does not hold a chunk says so and the asking node takes
another path. Chunks are served from the cache under the grant's bucket incarnation, so a grant for
one tenant's bucket can never reach another bucket's cached bytes. A ``fill`` fetch (a cold request
split over two nodes' upstream links) also fetches what it lacks from the upstream through its own
cache, after checking the bucket's current incarnation is the grant's. Sending is paced to
``cluster.serve_max_bytes_per_s`` over all peers together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from awscrt import checksums as crt

from protocol.cluster import CHUNK_HEAD, MAX_VERSION_BYTES, NOT_HELD, PeerFetchAccepted, PeerFetchRange, PeerLookupReply
from protocol.cluster_auth import CallVerifier, PeerGrant, denied
from protocol.cluster_write import LAYER_DONE, RegionGrant, WritePart, agent_digest, check_inside
from protocol.config import ClusterConfig
from protocol.errors import ErrorCode, S3Error
from protocol.rpc import Op, encode_reply
from protocol.wire import decode_descriptor, decode_keys

from ..data_endpoint import DataEndpoint
from ..rpc_server import Reply, RpcCall, RpcServer
from ..store.open_files import MissingFile
from ..store.s3.chunks import S3ChunkSource
from ..transports.nixl_engine import Fenced, NixlEngine, NixlLink
from .part_writer import write_part

log = logging.getLogger("objectcache.cluster")
MAX_KEYS_BODY = 64 << 20
MAX_DESCRIPTOR_KEYS = 1 << 20
READ_AHEAD = 4  # chunks a peer stream reads from the cache ahead of the one it sends
SEND_AHEAD_BYTES = 4 << 20  # bytes a peer stream may queue for sending before it waits for the receiver
FILL_BATCH = 16  # chunks a fill pins (fetching them from the upstream at cache.fetch_concurrency) before streaming them


@dataclass
class Served:
    lookups: int = 0
    chunks: int = 0
    bytes: int = 0
    refused: int = 0
    tickets: int = 0
    direct_bytes: int = 0  # written straight into another node's engine's memory (peer-write)
    direct_layers: int = 0  # layer shares of those writes reported landed
    fenced: int = 0  # peer-writes stopped because the asking node took their part over
    writes_ended: int = 0  # peer-writes over (done, fenced or failed): none of their bytes can land any more
    by_tenant: dict[str, int] = field(default_factory=dict)


class Pace:
    """A byte-rate cap shared by every peer stream this node serves (0: none)."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate, self._next = bytes_per_s, 0.0

    async def take(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + nbytes / self.rate
        if start > now:
            await asyncio.sleep(start - now)


class PeerServer:
    def __init__(self, cfg: ClusterConfig, chunks: S3ChunkSource, data: DataEndpoint | None = None,
                 engine: Callable[[], NixlEngine] | None = None) -> None:
        self.cfg, self.chunks, self.data = cfg, chunks, data
        self.engine = engine  # this node's NIXL agent (peer -> engine over rdma), created on first use
        self.agents = EngineAgents()
        self.key = cfg.key.encode()
        self.verifier = CallVerifier(self.key)
        self.pace = Pace(cfg.serve_max_bytes_per_s)
        self.served = Served()
        self.rpc = RpcServer({Op.PEER_LOOKUP: self.lookup, Op.PEER_FETCH: self.fetch, Op.PEER_TICKET: self.ticket,
                              Op.PEER_WRITE: self.write}, max_body=MAX_KEYS_BODY,
                             request_timeout_s=cfg.peer_timeout_s, single_request=True)

    def _authorise(self, call: RpcCall, keys_of: Callable[[bytes], list[str]] = decode_keys) -> tuple[PeerGrant, list[str]]:
        op, fields = call.request.op.value, call.request.fields
        try:
            self.verifier.verify(op, fields, call.body)
            keys = keys_of(call.body)
            grant = PeerGrant.verify(fields.get("grant"), self.key, keys)
            if grant.bucket != fields.get("bucket") or grant.bucket_id != fields.get("bucket_id"):
                raise denied("the bucket is not the one its grant names")
        except Exception:
            self.served.refused += 1
            raise
        return grant, keys

    def _warm(self, bucket_id: str, keys: list[str]) -> int:
        return next((i for i, k in enumerate(keys) if self.chunks.cached_size(bucket_id, k)[1] is None), len(keys))

    async def lookup(self, call: RpcCall) -> Reply:
        grant, keys = self._authorise(call)
        self.served.lookups += 1
        return PeerLookupReply(self.cfg.node_id, self._warm(grant.bucket_id, keys), len(keys)).to_json()

    async def fetch(self, call: RpcCall) -> Reply:
        grant, keys = self._authorise(call)
        want = PeerFetchRange.from_json(call.request.fields, len(keys))
        if want.fill and await self.chunks.store.bucket_id(grant.bucket) != grant.bucket_id:
            self.served.refused += 1
            raise denied("the bucket's incarnation is not the one its grant names")
        writer = call.writer
        # A few chunks may wait in the send buffer: draining to asyncio's 64 KiB mark after each chunk kept this
        # stream in lock step with the receiver (each chunk sent only once the one before was nearly read).
        writer.transport.set_write_buffer_limits(high=SEND_AHEAD_BYTES)
        writer.write(encode_reply(PeerFetchAccepted(self.cfg.node_id).to_json()))
        chunks = self._filled(grant, keys, want) if want.fill else self._cached(grant.bucket_id, keys, want)
        async for index, data in chunks:
            if data is None:
                writer.write(CHUNK_HEAD.pack(index, NOT_HELD, 0, 0))
                break
            await self.pace.take(len(data))
            cid = self.chunks.cached_size(grant.bucket_id, keys[index])[0]
            version = self.chunks.files.version(cid).encode("ascii", "replace")[:MAX_VERSION_BYTES]
            writer.write(CHUNK_HEAD.pack(index, len(data), crt.crc32c(data), len(version)) + version + data)
            await writer.drain()
            self.served.chunks += 1
            self.served.bytes += len(data)
            self.served.by_tenant[grant.tenant] = self.served.by_tenant.get(grant.tenant, 0) + len(data)
        await writer.drain()
        return None

    async def _cached(self, bucket_id: str, keys: list[str], want: PeerFetchRange) -> AsyncIterator[tuple[int, bytes | None]]:
        """The range from this node's cache, stopping at the first chunk it does not hold (None). Chunks are read
        ``READ_AHEAD`` at a time in one trip to a worker thread, through the cache's open files, while the ones before
        go out: a read and a send per chunk in turn left the stream idle for a thread hop and a socket drain each
        (42 MB/s a stream on loopback), and an open and a close per chunk were half of each read's cost."""
        loop = asyncio.get_running_loop()
        end = want.start + want.count
        ahead: deque[tuple[list[int], asyncio.Future]] = deque()
        nxt, held = want.start, True
        try:
            while True:
                while held and nxt < end and len(ahead) < 2:
                    (indices, read), held = self._start_reads(loop, bucket_id, keys, nxt, min(end, nxt + READ_AHEAD))
                    if indices:
                        ahead.append((indices, read))
                        nxt += len(indices)
                if not ahead:
                    if nxt < end:
                        yield nxt, None  # the first chunk it does not hold
                    return
                indices, read = ahead.popleft()
                datas = await read
                for index, data in zip(indices, datas):
                    yield index, data
                if len(datas) < len(indices):  # dropped meanwhile
                    yield indices[len(datas)], None
                    return
        finally:
            for _, read in ahead:  # a stream cut short: let its reads finish (they release their files), unread
                read.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)

    def _start_reads(self, loop: asyncio.AbstractEventLoop, bucket_id: str, keys: list[str], lo: int, hi: int
                     ) -> tuple[tuple[list[int], asyncio.Future], bool]:
        """Reads of the held chunks among ``keys[lo:hi]`` (up to the first one not held) in one worker-thread trip, and
        whether all of them were held. They are pinned (not evicted) and their files held open until read."""
        files = self.chunks.files
        found: list[tuple[int, str, int]] = []
        for index in range(lo, hi):
            cid, size = self.chunks.cached_size(bucket_id, keys[index])
            if size is None:
                break
            found.append((index, cid, size))
        cids = [c for _, c, _ in found]
        paths = [os.fspath(files.path(c, n)) for _, c, n in found]
        files.policy.pin(cids)
        opened = self.chunks.open

        def read() -> list[bytes]:
            n = len(paths)
            while True:
                try:
                    fds = opened.acquire(paths[:n])
                    break
                except MissingFile as e:  # dropped meanwhile: the chunks before it are still sent
                    n = e.index
            try:
                return [os.pread(fd, size, 0) for fd, (_, _, size) in zip(fds, found)]
            finally:
                opened.release(paths[:n], fds)

        future = loop.run_in_executor(None, read) if found else loop.create_future()
        if not found:
            future.set_result([])
        future.add_done_callback(lambda _: files.policy.unpin(cids))
        return ([i for i, _, _ in found], future), len(found) == hi - lo

    async def _filled(self, grant: PeerGrant, keys: list[str], want: PeerFetchRange) -> AsyncIterator[tuple[int, bytes | None]]:
        """The range through this node's cache, fetching what it lacks from the upstream, a batch pinned at a time."""
        loop = asyncio.get_running_loop()
        end = want.start + want.count
        for lo in range(want.start, end, FILL_BATCH):
            batch = keys[lo:min(end, lo + FILL_BATCH)]
            try:
                pinned = await self.chunks.pin(grant.bucket, batch)  # no PinFor: never asks peers in turn
            except S3Error as e:
                log.info("cluster: fill for %s stopped at chunk %d: %s", grant.issuer, lo, e.message)
                yield lo, None
                return
            try:
                for j, (fd, size) in enumerate(zip(pinned.fds, pinned.sizes)):
                    yield lo + j, await loop.run_in_executor(None, os.pread, fd, size, 0)
            finally:
                pinned.release()

    async def ticket(self, call: RpcCall) -> Reply:
        """A ticket for this node's data endpoint, so the asking node's client streams the kv-get from here
        (peer -> engine): only for a descriptor whose every chunk this node holds, in the grant's bucket incarnation."""
        grant, keys = self._authorise(call, lambda body: decode_descriptor(body, MAX_DESCRIPTOR_KEYS).chunk_keys)
        if await self.chunks.store.bucket_id(grant.bucket) != grant.bucket_id:
            self.served.refused += 1
            raise denied("the bucket's incarnation is not the one its grant names")
        if self.data is None or not self.data.endpoint:
            raise S3Error(ErrorCode.ServiceUnavailable, f"node {self.cfg.node_id} has no data endpoint (storage_server.data_listen)")
        if self._warm(grant.bucket_id, keys) < len(keys):
            raise S3Error(ErrorCode.ServiceUnavailable, f"node {self.cfg.node_id} no longer holds every chunk")
        self.served.tickets += 1
        return self.data.issue(grant.tenant, grant.bucket, grant.bucket_id, grant.request_id, call.body, via=self.cfg.node_id)

    async def write(self, call: RpcCall) -> Reply:
        """Peer -> engine over rdma: this node's part of another node's kv-get, written from its cache straight into
        the engine's registered memory the region grant names, one LAYER_DONE per layer (:mod:`protocol.cluster_write`)."""
        fields = call.request.fields
        n = fields.get("descriptor_bytes")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < len(call.body):
            self.served.refused += 1
            raise S3Error(ErrorCode.InvalidRequest, "bad peer-write: field 'descriptor_bytes' must say where the descriptor ends",
                          extra={"ArgumentName": "descriptor_bytes"})
        metadata = call.body[n:]
        grant, keys = self._authorise(call, lambda body: decode_descriptor(body[:n], MAX_DESCRIPTOR_KEYS).chunk_keys)
        try:
            region = RegionGrant.verify(fields.get("region"), self.key, metadata)
            if (region.tenant, region.request_id, region.grant_nonce) != (grant.tenant, grant.request_id, grant.nonce):
                raise denied("its region grant is for another kv-get")
            d = decode_descriptor(call.body[:n], MAX_DESCRIPTOR_KEYS)
            part = WritePart.from_json(fields, len(keys), d.num_layers)
            check_inside(region, part, d.target.offset, d.per_layer_chunk_bytes, len(keys))
        except S3Error:
            self.served.refused += 1
            raise
        if await self.chunks.store.bucket_id(grant.bucket) != grant.bucket_id:
            self.served.refused += 1
            raise denied("the bucket's incarnation is not the one its grant names")
        if self.engine is None:
            raise S3Error(ErrorCode.ServiceUnavailable, f"node {self.cfg.node_id} has no rdma engine")
        part_keys = keys[part.chunk_lo:part.chunk_hi]
        if self._warm(grant.bucket_id, part_keys) < len(part_keys):
            raise S3Error(ErrorCode.ServiceUnavailable, f"node {self.cfg.node_id} no longer holds every chunk of the part")
        pinned = await self.chunks.pin(grant.bucket, part_keys)  # no PinFor: never asks peers in turn
        link = None
        watch = _EndWatch(call.writer)
        try:
            if pinned.sizes.count(d.chunk_object_bytes) != len(pinned.sizes):  # one count in C, not a property per chunk
                raise S3Error(ErrorCode.ServiceUnavailable, f"node {self.cfg.node_id} holds chunks of another size")
            engine = self.engine()
            link = NixlLink(engine, self.agents.name(engine, metadata, grant.tenant), region.addr, region.size, region.device)
            call.writer.write(encode_reply(PeerFetchAccepted(self.cfg.node_id).to_json()))
            share = part.chunks * d.per_layer_chunk_bytes

            async def landed(layer: int, crc: int) -> None:
                call.writer.write(LAYER_DONE.pack(layer, crc))
                s = self.served
                s.direct_bytes += share
                s.direct_layers += 1
                s.by_tenant[grant.tenant] = s.by_tenant.get(grant.tenant, 0) + share
                await call.writer.drain()

            try:
                await write_part(link, pinned, 0, part, d.target.offset, d.per_layer_chunk_bytes, len(keys), landed,
                                 watch.ended, self.pace.take)
            except Fenced:
                self.served.fenced += 1
                log.info("cluster: peer-write for %s fenced (its part was taken over)", grant.issuer)
            except (OSError, S3Error) as e:
                log.warning("cluster: peer-write for %s stopped: %s", grant.issuer, getattr(e, "message", e))
        finally:
            watch.close()
            if link is not None:
                link.close()
            pinned.release()
            self.served.writes_ended += 1
        return None

    async def listen(self, address: str) -> asyncio.AbstractServer:
        return await self.rpc.listen("", address)

    def status(self) -> dict[str, object]:
        s = self.served
        return {"lookups": s.lookups, "chunks": s.chunks, "bytes": s.bytes, "refused": s.refused, "tickets": s.tickets,
                "direct_bytes": s.direct_bytes, "direct_layers": s.direct_layers, "fenced": s.fenced,
                "writes_ended": s.writes_ended}


class EngineAgents:
    """Engines' NIXL agents this node wrote into recently, kept known (one link each) so the next kv-get of the same
    engine does not load its metadata and connect again: at most ``keep`` agents, LRU."""

    def __init__(self, keep: int = 32) -> None:
        self.keep = keep
        self._names: OrderedDict[tuple[str, str], bytes] = OrderedDict()  # (tenant, metadata digest) -> agent name

    def name(self, engine: NixlEngine, metadata: bytes, tenant: str) -> bytes:
        """The agent's name with one more link held for the caller (each call is matched by one ``engine.forget``)."""
        key = (tenant, agent_digest(metadata))
        name = self._names.get(key)
        if name is not None and engine.reuse(name, tenant):
            self._names.move_to_end(key)
            return name
        name = engine.add_client(metadata, tenant)
        if engine.reuse(name, tenant):  # the link this cache holds
            self._names[key] = name
            while len(self._names) > self.keep:
                engine.forget(self._names.popitem(last=False)[1])
        return name


class _EndWatch:
    """Whether the asking node has ended the connection (its fence): a non-blocking peek at the socket itself, so the
    answer is current when asked (not when the event loop gets round to reading)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        raw = writer.get_extra_info("socket")
        self._sock = socket.socket(fileno=os.dup(raw.fileno())) if raw is not None else None
        self._ended = self._sock is None

    def ended(self) -> bool:
        if not self._ended:
            assert self._sock is not None
            try:
                self._ended = True  # end of stream, or anything the asking node sends: both mean stop
                self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                self._ended = False
            except OSError:
                pass
        return self._ended

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
