"""The s3 backend's chunk cache under per-tenant bounds: a tenant at its bound evicts its own chunks, not another's."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage_server.store.cache.chunk_files import ChunkFiles
from storage_server.store.cache.tenants import TenantQuotas

CHUNK = 64


def _store(files: ChunkFiles, cid: str, tenant: str, parent: str | None = None) -> bool:
    if not files.reserve(CHUNK, tenant):
        return False
    tmp = files.new_tmp()
    tmp.write_bytes(b"x" * CHUNK)
    files.commit(cid, tmp, CHUNK, "etag", parent, tenant)
    return True


@pytest.mark.parametrize("policy", ["lru", "prefix"])
def test_a_tenant_at_its_bound_evicts_its_own_chunks_first(tmp_path: Path, policy: str):
    files = ChunkFiles(tmp_path, 16 * CHUNK, policy, TenantQuotas(16 * CHUNK, default=8 * CHUNK))
    warm = [f"{i:02x}" * 20 for i in range(4)]
    for i, cid in enumerate(warm):
        assert _store(files, cid, "bob", warm[i - 1] if i else None)
    files.policy.touch_chain(warm)
    flood = [f"{i + 16:02x}" * 20 for i in range(40)]
    for cid in flood:
        assert _store(files, cid, "alice")
    assert all(files.size(cid) == CHUNK for cid in warm)  # Bob's prefix is whole
    assert files.policy.tenant_used("alice") == 8 * CHUNK and files.policy.tenant_used("bob") == 4 * CHUNK
    status = files.tenant_status()
    assert status["alice"]["evictions"] == 32 and status["bob"]["evictions"] == 0
    assert [files.size(cid) for cid in flood[-8:]] == [CHUNK] * 8  # Alice's newest stay


def test_without_a_tenant_bound_the_flood_takes_the_other_tenants_prefix(tmp_path: Path):
    files = ChunkFiles(tmp_path, 16 * CHUNK, "lru")
    warm = [f"{i:02x}" * 20 for i in range(4)]
    for cid in warm:
        assert _store(files, cid, "bob")
    for i in range(40):
        assert _store(files, f"{i + 16:02x}" * 20, "alice")
    assert all(files.size(cid) is None for cid in warm)
