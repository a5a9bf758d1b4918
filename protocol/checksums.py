"""Incremental object digests: MD5 (ETag), SHA-256 (payload signing) and the
S3 additional checksums (CRC32, CRC32C, CRC64NVME, SHA1, SHA256).

One :class:`Digester` is fed every body chunk once; all requested digests are
updated from the same bytes so the body is never read twice.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Iterable

from awscrt import checksums as crt

from .errors import ErrorCode, S3Error

ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")


class _Crc:
    def __init__(self, fn, width: int) -> None:
        self._fn, self._width, self._value = fn, width, 0

    def update(self, data: bytes) -> None:
        self._value = self._fn(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._width, "big")


# CRC32C of ``A + B`` from ``crc32c(A)``, ``crc32c(B)`` and ``len(B)``: runs checksummed in parallel, joined
# in order without reading them again (aws-c-checksums' combine; awscrt >= 0.31).
crc32c_combine = crt.combine_crc32c


def new_checksum(algorithm: str):
    """A hashlib-like object for an S3 checksum algorithm name (upper case)."""
    if algorithm == "CRC32":
        return _Crc(zlib.crc32, 4)
    if algorithm == "CRC32C":
        return _Crc(crt.crc32c, 4)
    if algorithm == "CRC64NVME":
        return _Crc(crt.crc64nvme, 8)
    if algorithm == "SHA1":
        return hashlib.sha1()
    if algorithm == "SHA256":
        return hashlib.sha256()
    raise ValueError(algorithm)


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class Digester:
    """MD5 always; optional SHA-256 of the payload; any S3 checksums."""

    def __init__(self, algorithms: Iterable[str] = (), payload_sha256: bool = False) -> None:
        self.md5 = hashlib.md5()
        self.sha256 = hashlib.sha256() if payload_sha256 else None
        self.checksums = {a: new_checksum(a) for a in algorithms}
        self.size = 0

    def update(self, data: bytes) -> None:
        self.size += len(data)
        self.md5.update(data)
        if self.sha256 is not None:
            self.sha256.update(data)
        for c in self.checksums.values():
            c.update(data)

    def checksum_values(self) -> dict[str, str]:
        return {a: b64(c.digest()) for a, c in self.checksums.items()}


def composite_checksum(algorithm: str, part_values: list[str]) -> str:
    """S3's multipart COMPOSITE checksum: checksum of the parts' raw checksums, ``-N``."""
    c = new_checksum(algorithm)
    for v in part_values:
        c.update(base64.b64decode(v))
    return f"{b64(c.digest())}-{len(part_values)}"


_COMBINE = {"CRC32": (crt.combine_crc32, 4), "CRC32C": (crt.combine_crc32c, 4), "CRC64NVME": (crt.combine_crc64nvme, 8)}


def full_object_checksum(algorithm: str, parts: list[tuple[str, int]]) -> str | None:
    """A CRC of the whole object from its parts' (base64 value, size), in order, without reading
    the bytes again; None for an algorithm that cannot be combined (SHA1, SHA256)."""
    if algorithm not in _COMBINE:
        return None
    combine, width = _COMBINE[algorithm]
    value = 0
    for i, (v, size) in enumerate(parts):
        crc = int.from_bytes(base64.b64decode(v), "big")
        value = crc if i == 0 else combine(value, crc, size)
    return b64(value.to_bytes(width, "big"))


def verify_digests(d: Digester, expected_md5: bytes | None, expected_checksums: dict[str, str]) -> None:
    """Compare what was received with what the client declared (Content-MD5, x-amz-checksum-*)."""
    if expected_md5 is not None and d.md5.digest() != expected_md5:
        raise S3Error(ErrorCode.BadDigest, "The Content-MD5 you specified did not match what we received.")
    values = d.checksum_values()
    for alg, expected in expected_checksums.items():
        if alg not in values:
            raise S3Error(ErrorCode.InvalidRequest, f"Checksum {alg} was sent but not announced in x-amz-trailer or x-amz-sdk-checksum-algorithm.")
        if values[alg] != expected:
            raise S3Error(ErrorCode.BadDigest, f"The {alg} you specified did not match the calculated checksum.")
