"""tenants_file: one [[tenants]] definition every node of a cluster reads (issue 23 item 9)."""

from __future__ import annotations

import pytest

from protocol.config import ConfigError, load_config

TENANTS = '[[tenants]]\nname = "alice"\naccess_key = "AKALICE"\nsecret_key = "s3cr3t-alice"\n'


def test_the_tenants_come_from_the_shared_file(tmp_path):
    (tmp_path / "tenants.toml").write_text(TENANTS)
    (tmp_path / "node.toml").write_text(f'tenants_file = "{tmp_path / "tenants.toml"}"\n')
    cfg = load_config(tmp_path / "node.toml", env={})
    assert [(t.name, t.access_key) for t in cfg.tenants] == [("alice", "AKALICE")]
    cfg = load_config(None, env={"OBJECTCACHE_TENANTS_FILE": str(tmp_path / "tenants.toml")})
    assert [t.name for t in cfg.tenants] == ["alice"]
    # OBJECTCACHE_TENANTS still replaces the list.
    cfg = load_config(tmp_path / "node.toml", env={"OBJECTCACHE_TENANTS": "bob:AKBOB:secret-bob"})
    assert [t.name for t in cfg.tenants] == ["bob"]


def test_tenants_in_two_places_or_other_keys_in_the_file_are_refused(tmp_path):
    (tmp_path / "tenants.toml").write_text(TENANTS)
    (tmp_path / "node.toml").write_text(f'tenants_file = "{tmp_path / "tenants.toml"}"\n' + TENANTS.replace("alice", "carol"))
    with pytest.raises(ConfigError, match="not both"):
        load_config(tmp_path / "node.toml", env={})
    (tmp_path / "bad.toml").write_text('[gateway]\nport = 1\n' + TENANTS)
    with pytest.raises(ConfigError, match="only"):
        load_config(None, env={"OBJECTCACHE_TENANTS_FILE": str(tmp_path / "bad.toml")})
    with pytest.raises(ConfigError, match="not found"):
        load_config(None, env={"OBJECTCACHE_TENANTS_FILE": str(tmp_path / "missing.toml")})
    (tmp_path / "typo.toml").write_text(TENANTS.replace("secret_key", "secret"))
    with pytest.raises(ConfigError):
        load_config(None, env={"OBJECTCACHE_TENANTS_FILE": str(tmp_path / "typo.toml")})
