"""Every KV validation error is a clear S3-style error naming the field or key, before any byte moves."""

from __future__ import annotations

import dataclasses
import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from kvsupport import client, keys_for, make_chunks, run, tiny_layout
from rawhttp import signed

from client_sdk import ObjectCacheError
from protocol.wire import Descriptor, Target, TransportKind, encode_descriptor

LAYOUT = tiny_layout(16, num_layers=4)
DESCRIPTOR_FLAGS_AT = 82  # the fixed header's last field (uint16 at bytes 82..83)


@pytest.fixture(scope="module")
def kv_bucket(server, tenants, s3):
    bucket = "kv-errors"
    s3.create_bucket(Bucket=bucket)
    keys = keys_for(LAYOUT, 20, "err")

    async def put():
        async with client(server, tenants["alice"], bucket) as c:
            await c.put_chunks(keys, make_chunks(LAYOUT, 20, seed=1), LAYOUT)

    run(put())
    # A chunk key holding an object of the wrong size (written through plain S3).
    s3.put_object(Bucket=bucket, Key="err/wrong-size", Body=b"x" * 100)
    return bucket, keys


def descriptor(keys, **kw) -> Descriptor:
    n = len(keys)
    target = kw.pop("target", Target(TransportKind.HTTP, length=n * LAYOUT.chunk_bytes))
    return Descriptor(keys, LAYOUT.num_layers, LAYOUT.chunk_tokens, LAYOUT.per_layer_chunk_bytes, target, **kw)


def kv_get(server, tenant, bucket, body: bytes):
    r = signed(server.endpoint, tenant, "POST", f"/{bucket}?kv-get", body=body)
    doc = ET.fromstring(r.body) if r.status != 200 else None
    return r, doc


def test_unknown_version(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    body = bytearray(encode_descriptor(descriptor(keys[:2])))
    body[4] = 9  # version byte
    r, doc = kv_get(server, tenants["alice"], bucket, bytes(body))
    assert r.status == 400 and doc.findtext("Code") == "KVUnsupportedVersion"
    assert doc.findtext("Field") == "version" and "9" in doc.findtext("Message")


def test_unknown_descriptor_flags_are_refused(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    body = bytearray(encode_descriptor(descriptor(keys[:2])))
    struct.pack_into("<H", body, DESCRIPTOR_FLAGS_AT, 0x8000)
    r, doc = kv_get(server, tenants["alice"], bucket, bytes(body))
    assert r.status == 400 and doc.findtext("Code") == "KVInvalidDescriptor" and doc.findtext("Field") == "flags"


def test_missing_chunk_names_the_first_missing_key(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    wanted = keys[:3] + ["err/not-there-1", "err/not-there-2"] + keys[3:5]
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(descriptor(wanted)))
    assert r.status == 404 and doc.findtext("Code") == "NoSuchKey"
    assert doc.findtext("Key") == "err/not-there-1" and "err/not-there-1" in doc.findtext("Message")


def test_chunk_size_mismatch_names_the_key(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(descriptor(keys[:2] + ["err/wrong-size"])))
    assert r.status == 400 and doc.findtext("Code") == "KVChunkSizeMismatch"
    assert doc.findtext("Key") == "err/wrong-size" and doc.findtext("ActualSize") == "100"
    assert doc.findtext("ExpectedSize") == str(LAYOUT.chunk_bytes)


def test_target_too_small(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    d = descriptor(keys[:4], target=Target(TransportKind.HTTP, length=4 * LAYOUT.chunk_bytes - 1))
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(d))
    assert r.status == 400 and doc.findtext("Code") == "KVTargetTooSmall" and doc.findtext("Field") == "target.length"


def test_too_many_keys(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    many = [f"err/k{i}" for i in range(4097)]  # the test server allows 4,096
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(descriptor(many)))
    assert r.status == 400 and doc.findtext("Code") == "KVTooManyKeys" and "4096" in doc.findtext("Message")


def test_integer_overflow(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    d = Descriptor(keys[:4], 4, 16, 1 << 60, Target(TransportKind.HTTP, length=(1 << 63) - 1))
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(d))
    assert r.status == 400 and doc.findtext("Code") == "KVInvalidDescriptor"
    assert doc.findtext("Field") == "per_layer_chunk_bytes" and "overflow" in doc.findtext("Message")


def test_garbage_body(server, tenants, kv_bucket):
    bucket, _ = kv_bucket
    r, doc = kv_get(server, tenants["alice"], bucket, b"definitely not a descriptor, but long enough to parse" * 3)
    assert r.status == 400 and doc.findtext("Code") == "KVInvalidDescriptor"


def test_bad_compute_window(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(descriptor(keys[:2], compute_window=(0.1, 0.2))))
    assert r.status == 400 and doc.findtext("Field") == "compute_window"
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(descriptor(keys[:2], compute_window=(float("nan"),))))
    assert r.status == 400 and doc.findtext("Field") == "compute_window"


def test_an_rdma_target_nobody_registered_is_refused_clearly(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    d = descriptor(keys[:2], target=Target(TransportKind.RDMA, length=2 * LAYOUT.chunk_bytes))
    r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(d))
    assert r.status == 404 and doc.findtext("Code") == "KVNoSuchRegion" and doc.findtext("Field") == "target.region_id"


def test_other_tenant_cannot_read_chunks(server, tenants, kv_bucket):
    bucket, keys = kv_bucket
    r, doc = kv_get(server, tenants["bob"], bucket, encode_descriptor(descriptor(keys[:2])))
    assert r.status == 403 and doc.findtext("Code") == "AccessDenied"

    async def lookup():
        async with client(server, tenants["bob"], bucket) as c:
            with pytest.raises(ObjectCacheError) as e:
                await c.lookup(keys[:2])
            assert e.value.code.name == "AccessDenied"
            with pytest.raises(ObjectCacheError):
                await c.put_chunks(["err/bob"], [np.zeros(LAYOUT.chunk_bytes, np.uint8)])

    run(lookup())


def test_other_tenant_cannot_write_into_a_region(server, tenants, kv_bucket, s3_bob):
    """Bob presents Alice's region id and token: refused, and Alice's memory is untouched."""
    bucket, keys = kv_bucket
    s3_bob.create_bucket(Bucket="kv-bob-own")

    async def scenario():
        async with client(server, tenants["alice"], bucket) as alice, client(server, tenants["bob"], "kv-bob-own") as bob:
            await bob.put_chunks(keys[:2], make_chunks(LAYOUT, 2, seed=9), LAYOUT)
            regions = alice._destinations[TransportKind.SHM].pool
            region = await regions.acquire(LAYOUT.chunk_bytes * 2)
            regions.release(region)
            before = bytes(region.region.view[16:])
            stolen = Target(TransportKind.SHM, region.region_id, region.token, 0, 2 * LAYOUT.chunk_bytes)
            r, doc = kv_get(server, tenants["bob"], "kv-bob-own", encode_descriptor(descriptor(keys[:2], target=stolen)))
            assert r.status == 403 and doc.findtext("Code") == "AccessDenied" and doc.findtext("Field") == "target.token"
            # Right tenant, wrong token; and a range outside the region.
            forged = dataclasses.replace(stolen, token=bytes(16))
            r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(descriptor(keys[:2], target=forged)))
            assert r.status == 403
            outside = dataclasses.replace(stolen, offset=region.region.size - 8)
            r, doc = kv_get(server, tenants["alice"], bucket, encode_descriptor(descriptor(keys[:2], target=outside)))
            assert r.status == 400 and doc.findtext("Code") == "KVTargetTooSmall"
            assert bytes(region.region.view[16:]) == before

    run(scenario())


def test_descriptor_header_is_compact():
    d = descriptor(keys_for(LAYOUT, 3584, "llama-3.1-8b"))
    body = encode_descriptor(d)
    # 16-byte digests as hex suffixes + a shared prefix: about 33 bytes a key.
    assert len(body) < 3584 * 34 + 200
    assert struct.unpack_from("<4s", body)[0] == b"OCKV"


def test_corrupted_kv_put_body_is_refused(server, tenants, kv_bucket, s3):
    """kv-put bodies are unsigned but carry a CRC32C; a body that does not match is not stored."""
    import base64

    from awscrt.checksums import crc32c

    from protocol.wire import encode_put_batch

    bucket, _ = kv_bucket
    good = b"".join(bytes(p) for p in encode_put_batch([("err/corrupt", b"x" * LAYOUT.chunk_bytes)]))
    crc = base64.b64encode(crc32c(good).to_bytes(4, "big")).decode()
    bad = good[:-1] + b"y"
    r = signed(server.endpoint, tenants["alice"], "POST", f"/{bucket}?kv-put", headers={"x-amz-checksum-crc32c": crc},
               body=bad, payload_hash="UNSIGNED-PAYLOAD")
    assert r.status == 400 and ET.fromstring(r.body).findtext("Code") == "BadDigest"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="err/corrupt").get("Contents", [])]
    assert keys == []
