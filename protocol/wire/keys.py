"""Key lists on the wire: the body of ``?kv-lookup`` and the key section of a kv-get descriptor.

Keys travel as a shared prefix plus newline-separated suffixes (or, for lowercase hex suffixes of one width, their
raw bytes), so encoding and decoding thousands of keys is a handful of C-level calls. Decoding is strict: any
malformed input raises an :class:`S3Error` naming the field, never another exception.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from functools import cached_property
from typing import Any

from ..errors import ErrorCode, S3Error

KEY_LIST_MAGIC = b"OCKL"
MAX_KEY_BYTES = 1024  # an object key, a KV chunk's included (S3's limit; the gateway refuses longer keys with KeyTooLongError)
# Decoded key lists remembered by their bytes: a prefix fetched again decodes to the very same list with no
# per-key work (and the storage server's resolved pins are found by that list). Bounded in lists and keys.
KEY_MEMO_LISTS = 64
KEY_MEMO_KEYS = 1 << 18


def _bad(field_name: str, message: str, code: ErrorCode = ErrorCode.KVInvalidDescriptor) -> S3Error:
    return S3Error(code, f"{field_name}: {message}", extra={"Field": field_name})


class KeyList(list):
    """A decoded key list (never to be modified: equal bytes decode to this same object, see :data:`KEY_MEMO_LISTS`)."""

    @cached_property
    def distinct(self) -> int:
        """How many different keys it names (computed once per list)."""
        return len(set(self))


class KeyMemo:
    """Key lists already decoded (by their section's exact bytes) or encoded (by the keys), least recently used
    dropped first; bounded in lists and in the keys they hold."""

    def __init__(self, lists: int = KEY_MEMO_LISTS, keys: int = KEY_MEMO_KEYS) -> None:
        self.lists, self.keys = lists, keys
        self._memo: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._held = 0
        self.hits = self.misses = 0

    def get(self, raw: Any, valid: Callable[[Any], bool] | None = None) -> Any:
        """What ``raw`` maps to (None: nothing, or what ``valid`` refuses)."""
        found = self._memo.get(raw)
        if found is not None and (valid is None or valid(found[0])):
            self._memo.move_to_end(raw)
            self.hits += 1
            return found[0]
        self.misses += 1
        return None

    def put(self, raw: Any, value: Any, count: int) -> None:
        """Remember ``value`` under ``raw`` (replacing what was there)."""
        if count > self.keys:
            return
        old = self._memo.pop(raw, None)
        if old is not None:
            self._held -= old[1]
        self._memo[raw] = (value, count)
        self._held += count
        while len(self._memo) > self.lists or self._held > self.keys:
            self._held -= self._memo.popitem(last=False)[1][1]

    # By the keys themselves: found by (count, first key, last key), then checked equal to a copy of the keys. A tuple
    # of the keys as the memo key was built and hashed twice (get, move_to_end) on every kv-get, 79 µs of a 3,584-key
    # kv-get's client prologue (timeit); the check is 3 µs.
    def find(self, keys: list[str]) -> Any:
        """What was remembered for keys equal to ``keys`` (None: nothing)."""
        if not keys:
            return None
        found = self.get((len(keys), keys[0], keys[-1]), lambda held: held[0] == keys)
        return None if found is None else found[1]

    def remember(self, keys: list[str], value: Any) -> None:
        """``value`` for ``keys`` (a copy of them is kept: a list changed in place is not found again)."""
        if keys:
            self.put((len(keys), keys[0], keys[-1]), (list(keys), value), len(keys))

    def clear(self) -> None:
        self._memo.clear()
        self._held = 0


_KEY_MEMO = KeyMemo()
_ENCODED_MEMO = KeyMemo()  # a client fetching the same prefix again encodes its keys once (by the keys: find)

_KEYS_HEAD = struct.Struct("<4sHI")  # magic, prefix length, key count


def _common_prefix(keys: list[str]) -> str:
    return os.path.commonprefix(keys) if keys else ""


def encode_keys(keys: list[str]) -> bytes:
    prefix = _common_prefix(keys)
    # Never let the prefix swallow a whole key (an empty suffix is fine).
    n = len(prefix)
    suffixes = "\n".join(k[n:] for k in keys)
    for k in keys:
        if "\n" in k or not k:
            raise _bad("chunk_keys", f"key {k!r} is empty or contains a newline")
    p = prefix.encode()
    return _KEYS_HEAD.pack(KEY_LIST_MAGIC, len(p), len(keys)) + p + suffixes.encode()


def _binary_suffixes(keys: list[str], n: int) -> bytes | None:
    """The suffixes (after ``n`` prefix characters) as one width byte plus their raw bytes, when every one is
    lowercase hex of the same non-zero even width (at most 255 raw bytes); else None."""
    width = len(keys[0]) - n if keys else 0
    if not 2 <= width <= 510 or width % 2 or len(set(map(len, keys))) != 1:
        return None
    hexes = "".join(k[n:] for k in keys)
    try:
        raw = bytes.fromhex(hexes)
    except ValueError:
        return None
    if raw.hex() != hexes:  # upper case, or whitespace that fromhex skips
        return None
    return bytes([width // 2]) + raw


def _decode_keys(buf: memoryview, count: int, prefix_len: int, field_name: str = "chunk_keys", binary: bool = False) -> KeyList:
    if len(buf) < prefix_len:
        raise _bad(field_name, "truncated key prefix")
    try:
        prefix = bytes(buf[:prefix_len]).decode()
        if binary:
            return _binary_keys(buf[prefix_len:], count, prefix, field_name)
        blob = bytes(buf[prefix_len:]).decode()
    except UnicodeDecodeError:
        raise _bad(field_name, "keys are not valid UTF-8") from None
    suffixes = blob.split("\n") if count else []
    if count and len(suffixes) != count:
        raise _bad(field_name, f"declares {count} keys but carries {len(suffixes)}")
    if not count and blob:
        raise _bad(field_name, "declares 0 keys but carries key bytes")
    keys = KeyList(prefix + s for s in suffixes)
    for k in keys:
        if not k or len(k) > MAX_KEY_BYTES:
            raise _bad(field_name, f"key {k[:80]!r} is empty or longer than {MAX_KEY_BYTES} bytes")
    return keys


def _binary_keys(section: memoryview, count: int, prefix: str, field_name: str) -> KeyList:
    """Keys whose suffixes came as raw bytes (:attr:`DescriptorFlag.BINARY_KEY_SUFFIXES`)."""
    if count < 1 or len(section) < 1:
        raise _bad(field_name, "binary key suffixes need a width byte")
    width = section[0]
    if width < 1 or len(section) != 1 + width * count:
        raise _bad(field_name, f"declares {count} binary suffixes of {width} bytes but carries {len(section) - 1} bytes")
    if len(prefix.encode()) + 2 * width > MAX_KEY_BYTES or "\n" in prefix:
        raise _bad(field_name, f"keys are longer than {MAX_KEY_BYTES} bytes or hold a newline")
    hexes = bytes(section[1:]).hex()
    w = 2 * width
    return KeyList([prefix + hexes[i : i + w] for i in range(0, len(hexes), w)])


def decode_keys(data: bytes) -> list[str]:
    buf = memoryview(data)
    if len(buf) < _KEYS_HEAD.size:
        raise _bad("keys", "truncated key list")
    magic, prefix_len, count = _KEYS_HEAD.unpack_from(buf)
    if magic != KEY_LIST_MAGIC:
        raise _bad("keys", "not an ObjectCache key list")
    return _decode_keys(buf[_KEYS_HEAD.size :], count, prefix_len, "keys")
