"""Put batches (body of ``?kv-put``): many chunk objects in one request, their bytes sent without a copy."""

from __future__ import annotations

import struct

from .keys import MAX_KEY_BYTES, _bad

PUT_BATCH_MAGIC = b"OCPB"

_BATCH_HEAD = struct.Struct("<4sI")
_ITEM_HEAD = struct.Struct("<HQ")


def encode_put_batch(items: list[tuple[str, bytes | memoryview]]) -> list[bytes | memoryview]:
    """Pieces to send back to back (no copy of the chunk bytes)."""
    out: list[bytes | memoryview] = [_BATCH_HEAD.pack(PUT_BATCH_MAGIC, len(items))]
    for key, data in items:
        k = key.encode()
        if not k or len(k) > MAX_KEY_BYTES:
            raise _bad("key", f"key {key[:80]!r} is empty or longer than {MAX_KEY_BYTES} bytes")
        mv = memoryview(data).cast("B")
        out += [_ITEM_HEAD.pack(len(k), mv.nbytes) + k, mv]
    return out


def decode_put_batch(data: bytes) -> list[tuple[str, memoryview]]:
    buf = memoryview(data)
    if len(buf) < _BATCH_HEAD.size:
        raise _bad("batch", "truncated put batch")
    magic, count = _BATCH_HEAD.unpack_from(buf)
    if magic != PUT_BATCH_MAGIC:
        raise _bad("batch", "not an ObjectCache put batch")
    pos, items = _BATCH_HEAD.size, []
    for i in range(count):
        if pos + _ITEM_HEAD.size > len(buf):
            raise _bad("batch", f"truncated at item {i}")
        klen, dlen = _ITEM_HEAD.unpack_from(buf, pos)
        pos += _ITEM_HEAD.size
        if not 1 <= klen <= MAX_KEY_BYTES or pos + klen + dlen > len(buf):
            raise _bad("batch", f"item {i} overruns the batch")
        try:
            key = bytes(buf[pos : pos + klen]).decode()
        except UnicodeDecodeError:
            raise _bad("key", f"item {i}: key is not valid UTF-8") from None
        pos += klen
        items.append((key, buf[pos : pos + dlen]))
        pos += dlen
    if pos != len(buf):
        raise _bad("batch", f"{len(buf) - pos} trailing bytes after {count} items")
    return items
