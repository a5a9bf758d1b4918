"""Calling a peer node: one signed request per connection, a reply line, and for a fetch a stream of whole chunks.

Every call is signed with the cluster key (:func:`protocol.cluster_auth.sign_call`) and carries
the grant the kv-get's node signed. Nothing here trusts the peer: a reply that does not decode,
a chunk out of order, of the wrong size or failing its CRC32C, and silence longer than
``peer_timeout_s`` all end the stream with :class:`PeerFault`, and the caller takes another path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from awscrt import checksums as crt

from protocol.cluster import NOT_HELD, NodeInfo, PeerFetchAccepted, PeerFetchRange, PeerLookupReply
from protocol.cluster_auth import sign_call
from protocol.cluster_write import LAYER_DONE, WritePart
from protocol.compressed_chunk import FIXED_HEADER_BYTES, MAGIC, max_compressed_bytes
from protocol.data_ticket import DirectGrant
from protocol.errors import S3Error
from protocol.rpc import MAX_REQUEST_LINE, Op, RpcRequest, decode_reply
from protocol.wire import encode_keys

from .chunk_stream import ChunkStream, Destination, StreamBroken

# A checked chunk: its index in the granted list, its bytes and the upstream version the peer's copy holds ("": unknown).
OnChunk = Callable[[int, bytearray | memoryview, str], Awaitable[None]]


class PeerFault(Exception):
    """A peer path failed (unreachable, refused, stalled, broken, or sent bytes that fail their checks)."""


@dataclass(frozen=True)
class PeerCall:
    """What every call to a peer for one kv-get carries: the bucket incarnation, the granted keys and the grant."""

    bucket: str
    bucket_id: str
    keys: list[str]
    grant: str

    def fields(self) -> dict[str, object]:
        return {"bucket": self.bucket, "bucket_id": self.bucket_id, "grant": self.grant}


class PeerWrite:
    """A peer's part of a kv-get being written into the engine's memory (peer-write): its layer reports, and the fence."""

    def __init__(self, peer: NodeInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float) -> None:
        self.peer, self.reader, self.writer, self.timeout_s = peer, reader, writer, timeout_s

    async def next_layer(self) -> tuple[int, int]:
        """The next (layer, CRC32C of the part's share) the peer reports landed; PeerFault when it stops, breaks or stalls."""
        try:
            layer, crc = LAYER_DONE.unpack(await asyncio.wait_for(self.reader.readexactly(LAYER_DONE.size), self.timeout_s))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            raise PeerFault(f"{self.peer.node_id} stopped writing ({type(e).__name__})") from None
        return layer, crc

    async def fence(self, timeout_s: float) -> bool:
        """Tell the peer to stop (end of stream) and wait until it closes, which it does once its writes have stopped
        (or its process is gone); False when it did not within ``timeout_s`` (stalled or cut off)."""
        try:
            if self.writer.can_write_eof() and not self.writer.is_closing():
                self.writer.write_eof()
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(1 << 16):
                    pass
            return True
        except TimeoutError:
            return False
        except OSError:
            return True  # reset: the peer's end is gone
        finally:
            self.writer.close()


class PeerClient:
    def __init__(self, node_id: str, key: bytes, timeout_s: float) -> None:
        self.node_id, self.key, self.timeout_s = node_id, key, timeout_s

    async def _open(self, peer: NodeInfo, op: Op, fields: dict[str, object], body: bytes
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict]:
        host, _, port = peer.address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port), limit=MAX_REQUEST_LINE),
                                                    self.timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise PeerFault(f"{peer.node_id} unreachable ({type(e).__name__})") from None
        try:
            signed = sign_call(self.key, self.node_id, op.value, fields, body)
            writer.write(RpcRequest(op, signed, len(body)).encode() + body)
            line = await asyncio.wait_for(reader.readline(), self.timeout_s)
            if not line:
                raise PeerFault(f"{peer.node_id} closed the connection")
            return reader, writer, decode_reply(line)
        except BaseException as e:
            writer.close()
            if isinstance(e, S3Error):
                raise PeerFault(f"{peer.node_id} refused: {e.code.name}: {e.message}") from None
            if isinstance(e, (OSError, asyncio.TimeoutError, ValueError)):
                raise PeerFault(f"{peer.node_id} failed ({type(e).__name__})") from None
            raise

    async def lookup(self, peer: NodeInfo, call: PeerCall) -> PeerLookupReply:
        """How many leading granted keys ``peer`` holds warm."""
        _, writer, reply = await self._open(peer, Op.PEER_LOOKUP, call.fields(), encode_keys(call.keys))
        writer.close()
        try:
            answer = PeerLookupReply.from_json(reply)
        except S3Error as e:
            raise PeerFault(f"{peer.node_id} answered garbage: {e.message}") from None
        if answer.of != len(call.keys):
            raise PeerFault(f"{peer.node_id} answered about {answer.of} keys, not {len(call.keys)}")
        return answer

    async def ticket(self, peer: NodeInfo, call: PeerCall, descriptor: bytes) -> DirectGrant:
        """A ticket for ``peer``'s data endpoint, for the kv-get of ``descriptor`` (whose keys the grant names)."""
        _, writer, reply = await self._open(peer, Op.PEER_TICKET, call.fields(), descriptor)
        writer.close()
        try:
            grant = DirectGrant.from_json(reply)
        except S3Error as e:
            raise PeerFault(f"{peer.node_id} answered garbage: {e.message}") from None
        if not grant.endpoint or not grant.ticket:
            raise PeerFault(f"{peer.node_id} has no data endpoint")
        return grant

    async def write(self, peer: NodeInfo, call: PeerCall, part: WritePart, descriptor: bytes, metadata: bytes, region: str) -> PeerWrite:
        """Ask ``peer`` to write ``part`` of the kv-get of ``descriptor`` into the engine memory ``region`` grants."""
        fields = {**call.fields(), **part.to_json(), "descriptor_bytes": len(descriptor), "region": region}
        reader, writer, reply = await self._open(peer, Op.PEER_WRITE, fields, descriptor + metadata)
        try:
            PeerFetchAccepted.from_json(reply)
        except S3Error as e:
            writer.close()
            raise PeerFault(f"{peer.node_id} answered garbage: {e.message}") from None
        return PeerWrite(peer, reader, writer, self.timeout_s)

    async def fetch(self, peer: NodeInfo, call: PeerCall, want: PeerFetchRange, chunk_bytes: int, on_chunk: OnChunk,
                    destination: Destination | None = None) -> int:
        """Stream ``want`` from ``peer``, checking each chunk, until it has sent all or says it holds no more; how many came.
        PeerFault when the stream breaks, stalls or a chunk fails a check (the chunks before it were delivered).
        Each chunk is received straight into its own buffer, or where ``destination`` says (:class:`.chunk_stream.ChunkStream`)."""
        host, _, port = peer.address.rpartition(":")
        loop = asyncio.get_running_loop()
        largest = max(chunk_bytes, max_compressed_bytes(chunk_bytes))
        try:
            _, stream = await asyncio.wait_for(loop.create_connection(lambda: ChunkStream(largest, destination=destination), host.strip("[]"), int(port)),
                                               self.timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise PeerFault(f"{peer.node_id} unreachable ({type(e).__name__})") from None
        got = 0
        try:
            body = encode_keys(call.keys)
            signed = sign_call(self.key, self.node_id, Op.PEER_FETCH.value, {**call.fields(), **want.to_json()}, body)
            assert stream.transport is not None
            stream.transport.write(RpcRequest(Op.PEER_FETCH, signed, len(body)).encode() + body)
            PeerFetchAccepted.from_json(decode_reply(await stream.reply(self.timeout_s)))
            while got < want.count:
                chunk = await stream.next(self.timeout_s)
                if chunk.size == NOT_HELD:
                    break
                if chunk.index != want.start + got:
                    raise PeerFault(f"{peer.node_id} sent chunk {chunk.index} where {want.start + got} was due")
                size, data = chunk.size, chunk.data
                if size != chunk_bytes and not FIXED_HEADER_BYTES <= size <= max_compressed_bytes(chunk_bytes):
                    raise PeerFault(f"{peer.node_id} sent {size} bytes for a {chunk_bytes}-byte chunk")
                if size != chunk_bytes and data[: len(MAGIC)] != MAGIC:  # any other size must be a compressed chunk (checked whole by the kv-get)
                    raise PeerFault(f"{peer.node_id} sent {size} bytes for a {chunk_bytes}-byte chunk, not a compressed chunk")
                if crt.crc32c(data) != chunk.crc:
                    raise PeerFault(f"{peer.node_id} sent chunk {chunk.index} failing its CRC32C")
                await on_chunk(chunk.index, data, chunk.version)
                got += 1
            return got
        except S3Error as e:
            raise PeerFault(f"{peer.node_id} answered garbage: {e.message}") from None
        except (OSError, asyncio.TimeoutError, StreamBroken, ValueError) as e:
            raise PeerFault(f"{peer.node_id} stream broke after {got} chunk(s) ({type(e).__name__})") from None
        finally:
            stream.close()
