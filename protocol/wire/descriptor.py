"""The kv-get descriptor (body of ``POST /{bucket}?kv-get``): which chunk objects, the model layout, where the
payload goes, the compute window and the mode. Its keys use the key-list encoding of :mod:`.keys`."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, IntFlag

import numpy as np

from ..errors import ErrorCode, S3Error
from .keys import _ENCODED_MEMO, _KEY_MEMO, _bad, _binary_suffixes, _common_prefix, _decode_keys

DESCRIPTOR_MAGIC = b"OCKV"
DESCRIPTOR_VERSION = 1
MAX_PAYLOAD_BYTES = 1 << 48  # 256 TiB: far above any real payload, far below overflow
MAX_LAYERS = 1 << 16
MAX_DESCRIPTOR_BYTES = 64 << 20  # a kv-get descriptor or kv-lookup key list: what the gateway reads and the storage server accepts
TOKEN_BYTES = 16
REGION_ID_BYTES = 16


class Mode(IntEnum):
    AUTO = 0
    CHUNKWISE = 1
    LAYERWISE = 2


class Delivery(IntEnum):
    LAYER_MAJOR = 0


class DescriptorFlag(IntFlag):
    """Bits of the descriptor's flags field; unknown bits are refused."""

    NO_LAYER_CHECKSUMS = 1  # the client will not verify: LAYER frames carry checksum 0 and no CRC is computed
    LOAD_BUDGET = 2  # a float64 load budget (seconds) follows the compute window
    # The key suffixes are lowercase hex of one width, sent as their raw bytes: one byte (the raw width) then
    # count·width bytes instead of newline-separated text (content hashes: half the bytes, no separators).
    BINARY_KEY_SUFFIXES = 4
    CLIENT_DECODES = 8  # http and rdma: compressed chunks travel as stored (ENCODED / PACKED frames), the client decodes them
    # http only: a uint32 first layer follows (the load budget): the frames start at that layer, the ones before it
    # are in the client's hands already (a kv-get resumed after the stream serving it broke, see client_sdk.stream)
    FIRST_LAYER = 16
    # http and rdma: the client can decode, the node picks the site per kv-get (scheduler.decode_site); the client's
    # decode workers, decode rate and declared link rate (_DECODE_AUTO) follow the first layer.
    DECODE_AUTO = 32
    # The session socket only (protocol.session): a KEY_LIST_REF_BYTES reference precedes the key section, which that
    # session's later kv-gets may send in place of the keys (KEY_LIST_REF). A 3,584-key list is 57 KB to encode, send,
    # read and hash on every kv-get of a repeated prefix; its reference is 16 bytes.
    KEY_LIST_NAMED = 64
    KEY_LIST_REF = 128  # the reference alone, no key section: the keys the session named by it (count must match)


# A plain int: ~IntFlag only inverts the defined bits. A server that does not know a bit refuses it,
# so an old server never silently ignores a load budget.
_KNOWN_FLAGS = int(DescriptorFlag.NO_LAYER_CHECKSUMS | DescriptorFlag.LOAD_BUDGET | DescriptorFlag.BINARY_KEY_SUFFIXES
                   | DescriptorFlag.CLIENT_DECODES | DescriptorFlag.FIRST_LAYER | DescriptorFlag.DECODE_AUTO
                   | DescriptorFlag.KEY_LIST_NAMED | DescriptorFlag.KEY_LIST_REF)
KEY_LIST_REF_BYTES = 16
# The bits as plain ints for the codec: ``int & IntFlag`` goes through enum's reflected operator and builds a flag
# object (2-3 µs each; 16 of them were a third of decoding a repeated 64-key descriptor, cProfile).
_NO_CHECKS, _BUDGET, _BINARY, _CLIENT_DECODES, _FIRST, _AUTO, _NAMED, _REF = (int(f) for f in (
    DescriptorFlag.NO_LAYER_CHECKSUMS, DescriptorFlag.LOAD_BUDGET, DescriptorFlag.BINARY_KEY_SUFFIXES,
    DescriptorFlag.CLIENT_DECODES, DescriptorFlag.FIRST_LAYER, DescriptorFlag.DECODE_AUTO, DescriptorFlag.KEY_LIST_NAMED,
    DescriptorFlag.KEY_LIST_REF))
# DECODE_AUTO's fields: the client's decode workers, its measured decode rate (raw bytes/s per core; 0: not yet)
# and the link rate it declares towards the node (bytes/s; 0: unknown).
_DECODE_AUTO = struct.Struct("<Hdd")


class TransportKind(IntEnum):
    HTTP = 0
    SHM = 1
    RDMA = 2  # RDMA WRITEs into memory the client registered (kv-register-rdma)


@dataclass(frozen=True)
class Target:
    """Where the payload lands. For ``shm``: a registered region and a capability token."""

    transport: TransportKind = TransportKind.HTTP
    region_id: bytes = bytes(REGION_ID_BYTES)
    token: bytes = bytes(TOKEN_BYTES)
    offset: int = 0
    length: int = 0


@dataclass(frozen=True)
class Descriptor:
    chunk_keys: list[str]
    num_layers: int
    chunk_tokens: int
    per_layer_chunk_bytes: int
    target: Target
    compute_window: tuple[float, ...] = ()  # seconds per layer: empty, one value, or one per layer
    mode: Mode = Mode.AUTO
    delivery: Delivery = Delivery.LAYER_MAJOR
    version: int = DESCRIPTOR_VERSION
    layer_checksums: bool = True  # CRC32C of each layer in its LAYER frame (costs a pass over the bytes)
    # Seconds from the storage server's receipt by which the load must be in place (0: none). The server cuts a
    # layerwise transfer at the first layer boundary it expects to cross the budget (KVLoadBudgetExceeded).
    load_budget_s: float = 0.0
    # http: every layer slice comes as an ENCODED frame (protocol.compressed_chunk), rdma: each layer packed (protocol.packed_layer)
    # in place of its raw bytes (PACKED frame), for the client to decode
    client_decodes: bool = False
    # http: the layers before this one are not sent (the client holds them from a stream that broke; offsets stay the whole payload's)
    first_layer: int = 0
    # http and rdma: the client can decode; the node chooses per kv-get (DECODE_AUTO). Not with client_decodes.
    decode_auto: bool = False
    client_decode_workers: int = 0
    client_decode_bytes_per_s: float = 0.0  # per core, measured by the client (0: not yet)
    client_link_bytes_per_s: float = 0.0  # declared by the client (0: unknown)
    # The session socket's name for these keys (KEY_LIST_NAMED; b"": none). ``keys_by_ref``: encoded as that name alone.
    key_ref: bytes = b""
    keys_by_ref: bool = False

    @property
    def payload_bytes(self) -> int:
        """W = N · L · S: the whole layer-major payload."""
        return len(self.chunk_keys) * self.num_layers * self.per_layer_chunk_bytes

    @property
    def layer_bytes(self) -> int:
        return len(self.chunk_keys) * self.per_layer_chunk_bytes

    @property
    def chunk_object_bytes(self) -> int:
        return self.num_layers * self.per_layer_chunk_bytes


_DESC_HEAD = struct.Struct("<4sBBBBIIQI16s16sQQIHH")


_ZERO, _A = np.uint8(ord("0")), np.uint8(ord("a"))


def _uniform_key_section(keys: list[str]) -> tuple[int, bytes | None] | None:
    """:func:`encode_descriptor`'s prefix length and binary suffixes for keys of one length in ASCII, column-wise with
    numpy (a 3,584-key prefix: no per-key Python work on the first layer's path); None where the general path decides."""
    width = len(keys[0]) if len(keys) > 1 else 0
    if not width or len(set(map(len, keys))) != 1:
        return None
    joined = "".join(keys)
    if not joined.isascii() or "\n" in joined:
        return None  # the general path (it names a key with a newline)
    a = np.frombuffer(joined.encode("ascii"), np.uint8).reshape(len(keys), width)
    # The common prefix is no longer than the first and last keys': compare only those columns across all keys.
    bound = np.flatnonzero(a[0] != a[-1])
    m = int(bound[0]) if bound.size else width
    differs = (a[:, :m] != a[0, :m]).any(axis=0)
    n = int(differs.argmax()) if differs.any() else m
    if (width - n) % 2 and n:
        n -= 1  # an even hex width (the common prefix may end inside the hex digits)
    if not 2 <= width - n <= 510 or (width - n) % 2:
        return n, None
    c = np.ascontiguousarray(a[:, n:])
    if not (((c - _ZERO) < 10) | ((c - _A) < 6)).all():  # uint8 wraps: below '0' or 'a' is large
        return n, None  # not lowercase hex: text suffixes
    pairs = c.view("<u2")  # two hex digits: the first in the low byte
    values = (pairs & 0x0F0F) + 9 * ((pairs >> 6) & 0x0101)  # each digit's value: c & 15, plus 9 for a letter
    return n, bytes([(width - n) // 2]) + (((values & 0xFF) << 4) | (values >> 8)).astype(np.uint8).tobytes()


def _key_section(keys: list[str]) -> tuple[bytes, bytes, bool]:
    """The encoded prefix, the suffixes (raw bytes or newline-separated text) and whether they are binary."""
    uniform = _uniform_key_section(keys)
    if uniform is not None:
        n, binary = uniform
        prefix = keys[0][:n]
    else:
        prefix = _common_prefix(keys)
        n = len(prefix)
        for k in keys:
            if "\n" in k or not k:
                raise _bad("chunk_keys", f"key {k!r} is empty or contains a newline")
        if keys and (len(keys[0]) - n) % 2 and n:
            n -= 1  # an even hex width (the common prefix may end inside the hex digits)
            prefix = prefix[:n]
        binary = _binary_suffixes(keys, n)
    return prefix.encode(), binary if binary is not None else "\n".join(k[n:] for k in keys).encode(), binary is not None


def _encoded_keys(keys: list[str]) -> tuple[bytes, bytes, bool]:
    """:func:`_key_section`, remembered for keys equal to ones encoded before."""
    section = _ENCODED_MEMO.find(keys)
    if section is None:
        section = _key_section(keys)
        _ENCODED_MEMO.remember(keys, section)
    return section


def encode_descriptor(d: Descriptor) -> bytes:
    if d.key_ref and len(d.key_ref) != KEY_LIST_REF_BYTES:
        raise _bad("key_ref", f"must be {KEY_LIST_REF_BYTES} bytes, not {len(d.key_ref)}")
    if d.keys_by_ref and not d.key_ref:
        raise _bad("key_ref", "keys_by_ref needs the reference the keys were named by")
    p, suffixes, binary = (b"", b"", False) if d.keys_by_ref else _encoded_keys(d.chunk_keys)
    head = _DESC_HEAD.pack(
        DESCRIPTOR_MAGIC, d.version, d.mode, d.delivery, d.target.transport,
        d.num_layers, d.chunk_tokens, d.per_layer_chunk_bytes, len(d.chunk_keys),
        d.target.region_id, d.target.token, d.target.offset, d.target.length,
        len(d.compute_window), len(p), _flags(d) | (_BINARY if binary else 0) | (_REF if d.keys_by_ref else _NAMED if d.key_ref else 0),
    )
    window = struct.pack(f"<{len(d.compute_window)}d", *d.compute_window)
    if d.load_budget_s:
        window += struct.pack("<d", d.load_budget_s)
    if d.first_layer:
        window += struct.pack("<I", d.first_layer)
    if d.decode_auto:
        window += _DECODE_AUTO.pack(d.client_decode_workers, d.client_decode_bytes_per_s, d.client_link_bytes_per_s)
    return head + p + window + d.key_ref + suffixes


def _flags(d: Descriptor) -> int:
    if not (math.isfinite(d.load_budget_s) and d.load_budget_s >= 0):
        raise _bad("load_budget_s", f"must be a finite number of seconds >= 0, not {d.load_budget_s!r}")
    if not 0 <= d.first_layer < d.num_layers:
        raise _bad("first_layer", f"{d.first_layer} is outside 0..{d.num_layers - 1}")
    if d.decode_auto and not (0 < d.client_decode_workers < 1 << 16 and _rate_ok(d.client_decode_bytes_per_s)
                              and _rate_ok(d.client_link_bytes_per_s)):
        raise _bad("decode_auto", "needs 1..65535 client decode workers and finite rates >= 0")
    return ((0 if d.layer_checksums else _NO_CHECKS) | (_BUDGET if d.load_budget_s else 0) | (_CLIENT_DECODES if d.client_decodes else 0)
            | (_FIRST if d.first_layer else 0) | (_AUTO if d.decode_auto else 0))


def _rate_ok(v: float) -> bool:
    return math.isfinite(v) and v >= 0


def descriptor_transport(data: bytes) -> TransportKind | None:
    """The target transport from an intact descriptor header, without decoding the keys (a router's
    question); None where the header is not intact (:func:`decode_descriptor` then names what is wrong)."""
    if len(data) < _DESC_HEAD.size:
        return None
    magic, version, _mode, _delivery, transport = struct.unpack_from("<4sBBBB", data)
    if magic != DESCRIPTOR_MAGIC or version != DESCRIPTOR_VERSION or transport not in TransportKind._value2member_map_:
        return None
    return TransportKind(transport)


def decode_descriptor(data: bytes, max_keys: int | None = None, named_keys: Callable[[bytes], list[str] | None] | None = None) -> Descriptor:
    """Parse and validate a descriptor. Raises S3Error naming the bad field. ``named_keys``: the key list a reference
    names (the session socket's; None: unknown), for KEY_LIST_REF, which is refused where it is not given."""
    buf = memoryview(data)
    if len(buf) < _DESC_HEAD.size:
        raise _bad("descriptor", f"{len(buf)} bytes is shorter than the {_DESC_HEAD.size}-byte header")
    (magic, version, mode, delivery, transport, layers, tokens, s, count, region, token, offset, length,
     n_window, prefix_len, flags) = _DESC_HEAD.unpack_from(buf)
    if magic != DESCRIPTOR_MAGIC:
        raise _bad("descriptor", "not an ObjectCache descriptor (bad magic)")
    if version != DESCRIPTOR_VERSION:
        raise _bad("version", f"version {version} is not supported (this server speaks {DESCRIPTOR_VERSION})", ErrorCode.KVUnsupportedVersion)
    try:
        mode_v, delivery_v, transport_v = Mode(mode), Delivery(delivery), TransportKind(transport)
    except ValueError as e:
        name = "mode" if mode not in Mode._value2member_map_ else "delivery" if delivery not in Delivery._value2member_map_ else "target.transport"
        raise _bad(name, str(e)) from None
    if flags & ~_KNOWN_FLAGS:
        raise _bad("flags", f"unknown flag bits {flags:#06x}")
    no_checks, has_budget, binary, client_decodes, has_first, auto_on, named, by_ref = (
        bool(flags & bit) for bit in (_NO_CHECKS, _BUDGET, _BINARY, _CLIENT_DECODES, _FIRST, _AUTO, _NAMED, _REF))
    if by_ref and (named or binary or prefix_len):
        raise _bad("flags", "KEY_LIST_REF carries the reference alone: no KEY_LIST_NAMED, BINARY_KEY_SUFFIXES or key prefix")
    if client_decodes and transport_v == TransportKind.SHM:
        raise _bad("flags", "CLIENT_DECODES needs the http or rdma transport (the server writes decoded layers into shm memory)")
    if has_first and transport_v != TransportKind.HTTP:
        raise _bad("flags", "FIRST_LAYER needs the http transport (a resumed stream; shm and rdma memory is written by the server)")
    if auto_on and (transport_v == TransportKind.SHM or client_decodes):
        raise _bad("flags", "DECODE_AUTO needs the http or rdma transport and excludes CLIENT_DECODES")
    if not 1 <= layers <= MAX_LAYERS:
        raise _bad("num_layers", f"{layers} is outside 1..{MAX_LAYERS}")
    if tokens < 1:
        raise _bad("chunk_tokens", "must be at least 1")
    if s < 1:
        raise _bad("per_layer_chunk_bytes", "must be at least 1")
    if count < 1:
        raise _bad("chunk_keys", "at least one chunk key is required")
    if max_keys is not None and count > max_keys:
        raise _bad("chunk_keys", f"{count} keys exceed this server's limit of {max_keys}", ErrorCode.KVTooManyKeys)
    payload = count * layers * s
    if payload > MAX_PAYLOAD_BYTES:
        raise _bad("per_layer_chunk_bytes", f"payload N*L*S = {payload} bytes overflows the {MAX_PAYLOAD_BYTES}-byte limit")
    if offset + length > (1 << 63):
        raise _bad("target", "offset + length overflows")
    if n_window not in (0, 1, layers):
        raise _bad("compute_window", f"must carry 0, 1 or num_layers ({layers}) values, not {n_window}")
    pos = _DESC_HEAD.size
    window_at = pos + prefix_len
    budget_at = window_at + 8 * n_window
    first_at = budget_at + (8 if has_budget else 0)
    auto_at = first_at + (4 if has_first else 0)
    keys_at = auto_at + (_DECODE_AUTO.size if auto_on else 0)
    if len(buf) < keys_at:
        raise _bad("descriptor", "truncated before the key list")
    window = struct.unpack_from(f"<{n_window}d", buf, window_at)
    if not all(math.isfinite(w) and w >= 0 for w in window):
        raise _bad("compute_window", "values must be finite and non-negative")
    budget = struct.unpack_from("<d", buf, budget_at)[0] if has_budget else 0.0
    if not (math.isfinite(budget) and budget >= 0) or (has_budget and budget == 0):
        raise _bad("load_budget_s", f"must be a finite number of seconds > 0 when its flag is set, not {budget!r}")
    first_layer = struct.unpack_from("<I", buf, first_at)[0] if has_first else 0
    if has_first and not 0 < first_layer < layers:
        raise _bad("first_layer", f"{first_layer} is outside 1..{layers - 1} when its flag is set")
    auto = _DECODE_AUTO.unpack_from(buf, auto_at) if auto_on else (0, 0.0, 0.0)
    if auto_on and not (auto[0] >= 1 and _rate_ok(auto[1]) and _rate_ok(auto[2])):
        raise _bad("decode_auto", f"needs at least 1 client decode worker and finite rates >= 0, not {auto}")
    key_ref = bytes(buf[keys_at : keys_at + KEY_LIST_REF_BYTES]) if named or by_ref else b""
    if (named or by_ref) and len(key_ref) != KEY_LIST_REF_BYTES:
        raise _bad("key_ref", f"truncated: a key list reference is {KEY_LIST_REF_BYTES} bytes")
    keys_at += len(key_ref)
    if by_ref:
        keys = _named(named_keys, key_ref, count, len(buf) - keys_at)
    else:
        prefix_and_keys = bytes(buf[pos:window_at]) + bytes(buf[keys_at:])
        memo_key = (b"B" if binary else b"T") + prefix_len.to_bytes(2, "little") + count.to_bytes(4, "little") + prefix_and_keys
        keys = _KEY_MEMO.get(memo_key)
        if keys is None:
            keys = _decode_keys(memoryview(prefix_and_keys), count, prefix_len, binary=binary)
            _KEY_MEMO.put(memo_key, keys, count)
    target = Target(transport_v, bytes(region), bytes(token), offset, length)
    if target.length < payload:
        raise _bad("target.length", f"{target.length} bytes is smaller than the payload ({payload} bytes)", ErrorCode.KVTargetTooSmall)
    return Descriptor(keys, layers, tokens, s, target, tuple(window), mode_v, delivery_v, version,
                      not no_checks, budget, client_decodes, first_layer,
                      auto_on, *auto, key_ref=key_ref, keys_by_ref=by_ref)


def _named(named_keys: Callable[[bytes], list[str] | None] | None, key_ref: bytes, count: int, extra: int) -> list[str]:
    """The keys a KEY_LIST_REF descriptor names."""
    if named_keys is None:
        raise _bad("flags", "KEY_LIST_REF is served on the session socket only (send the keys)")
    if extra:
        raise _bad("key_ref", f"{extra} bytes follow the key list reference")
    keys = named_keys(key_ref)
    if keys is None:
        raise S3Error(ErrorCode.KVUnknownKeyList, "key_ref: this session holds no key list by that reference; send the keys "
                      "(KEY_LIST_NAMED) again", extra={"Field": "key_ref"})
    if len(keys) != count:
        raise _bad("key_ref", f"the reference names {len(keys)} keys, the descriptor declares {count}")
    return keys
