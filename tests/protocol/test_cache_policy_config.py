"""cache.policy and the per-tenant cache bounds: documented values, bad ones refused naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.config import ConfigError, load_config
from storage_server.store.cache.tenants import TenantQuotas


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path, env=env or {})


def test_the_default_policy_is_reuse_and_an_unknown_one_is_refused(tmp_path: Path):
    assert _load(tmp_path, "").cache.policy == "reuse"
    assert _load(tmp_path, '[cache]\npolicy = "lru"\n').cache.policy == "lru"
    with pytest.raises(ConfigError, match="cache.policy"):
        _load(tmp_path, '[cache]\npolicy = "fifo"\n')
    with pytest.raises(ConfigError, match="cache.tenant_max_bytes"):
        _load(tmp_path, "[cache]\ntenant_max_bytes = -1\n")


def test_a_tenant_bound_is_its_own_else_the_default_and_never_above_the_node(tmp_path: Path):
    config = _load(tmp_path, "[cache]\nmax_bytes = 1000\ntenant_max_bytes = 300\n"
                             '[[tenants]]\nname = "big"\naccess_key = "AK1"\nsecret_key = "s1"\ncache_max_bytes = 5000\n'
                             '[[tenants]]\nname = "small"\naccess_key = "AK2"\nsecret_key = "s2"\ncache_max_bytes = 100\n'
                             '[[tenants]]\nname = "plain"\naccess_key = "AK3"\nsecret_key = "s3"\n')
    quotas = TenantQuotas.from_config(config)
    assert (quotas.of("big"), quotas.of("small"), quotas.of("plain"), quotas.of("")) == (1000, 100, 300, 1000)
