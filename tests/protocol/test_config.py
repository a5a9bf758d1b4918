"""Configuration: TOML + environment, refused loudly when wrong."""

from __future__ import annotations

import pytest

from protocol.config import ConfigError, load_config


def write(tmp_path, text: str):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults():
    cfg = load_config(env={})
    assert cfg.gateway.port == 9000 and cfg.store.data_dir == "./data" and cfg.tenants == ()


def test_tenants_and_sections(tmp_path):
    cfg = load_config(write(tmp_path, """
[gateway]
port = 9100
domains = ["s3.local", "localhost"]
[store]
data_dir = "/srv/oc"
[[tenants]]
name = "a"
access_key = "AK1"
secret_key = "s1"
[[tenants]]
name = "b"
access_key = "AK2"
secret_key = "s2"
"""), env={})
    assert cfg.gateway.port == 9100 and cfg.gateway.domains == ("s3.local", "localhost")
    assert [t.name for t in cfg.tenants] == ["a", "b"]


@pytest.mark.parametrize("text,needle", [
    ("[gateway]\nprot = 1\n", "prot"),
    ("[gatewy]\n", "gatewy"),
    ('[gateway]\nport = "x"\n', "gateway.port"),
    ("[gateway]\nport = 70000\n", "gateway.port"),
    ('[store]\nbackend = "nfs"\n', "store.backend"),
    ('[[tenants]]\nname = "a"\naccess_key = "k"\n', "secret_key"),
    ('[[tenants]]\nname = "a"\naccess_key = "k"\nsecret_key = "s"\nextra = 1\n', "extra"),
    ('[[tenants]]\nname = "a"\naccess_key = "k"\nsecret_key = "s"\n[[tenants]]\nname = "b"\naccess_key = "k"\nsecret_key = "t"\n', "used twice"),
    ("[storage_server]\nopen_files = -1\n", "storage_server.open_files"),
    ("[storage_server]\nhousekeeping_s = 0\n", "storage_server.housekeeping_s"),
    ("not toml [", "invalid TOML"),
])
def test_bad_config_is_refused_naming_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text), env={})
    assert needle in str(e.value)


def test_environment_overrides(tmp_path):
    cfg = load_config(write(tmp_path, "[gateway]\nport = 9100\n"), env={
        "OBJECTCACHE_GATEWAY_PORT": "9200",
        "OBJECTCACHE_STORE_DATA_DIR": "/x",
        "OBJECTCACHE_TENANTS": "t1:AKA:sa,t2:AKB:sb",
    })
    assert cfg.gateway.port == 9200 and cfg.store.data_dir == "/x"
    assert [(t.name, t.access_key) for t in cfg.tenants] == [("t1", "AKA"), ("t2", "AKB")]
    with pytest.raises(ConfigError, match="OBJECTCACHE_GATEWAY_PORT|gateway.port"):
        load_config(env={"OBJECTCACHE_GATEWAY_PORT": "nine"})
    with pytest.raises(ConfigError, match="OBJECTCACHE_TENANTS"):
        load_config(env={"OBJECTCACHE_TENANTS": "broken"})


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/objectcache.toml", env={})
