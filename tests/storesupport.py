"""Helpers for the store contract suites: a body in pieces, an object's bytes read whole, the S3 code an operation fails with."""

from __future__ import annotations

import pytest

from protocol.errors import ErrorCode, S3Error
from storage_server.store import ObjectStore
from storage_server.store.object_store import ByteRange, ObjectMeta


async def body(*pieces: bytes):
    """A request body arriving in these pieces."""
    for p in pieces:
        yield p


async def read_with_meta(store: ObjectStore, bucket: str, key: str, rng: ByteRange | None = None) -> tuple[bytes, ObjectMeta]:
    reader = await store.open_object(bucket, key)
    try:
        return b"".join([c async for c in reader.stream(rng)]), reader.meta
    finally:
        reader.close()


async def read_all(store: ObjectStore, bucket: str, key: str, rng: ByteRange | None = None) -> bytes:
    return (await read_with_meta(store, bucket, key, rng))[0]


async def code_of(aw) -> ErrorCode:
    """The code of the S3Error that awaiting ``aw`` raises (it must raise one)."""
    with pytest.raises(S3Error) as e:
        await aw
    return e.value.code
