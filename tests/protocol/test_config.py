"""Configuration: TOML + environment, refused loudly when wrong."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from protocol.config import ENV_VARS, Config, ConfigError, GatewayConfig, LocalStoreConfig, Tenant, load_config

REPO = Path(__file__).resolve().parents[2]


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
    ("[storage_server]\nmax_descriptor_keys = 0\n", "storage_server.max_descriptor_keys"),
    ("[storage_server]\nread_threads = -1\n", "storage_server.read_threads"),
    ('[storage_server]\nrdma_engine = "verbs"\n', "storage_server.rdma_engine"),
    ("[gateway]\nmax_list_keys = 1001\n", "gateway.max_list_keys"),
    ("[store.local]\nio_threads = 0\n", "store.local.io_threads"),
    ("[store.local]\nx = 1\n", "store.local.x"),
    ("[store]\nlocal = 4\n", "[store.local] must be a table"),
    ('[bandwidth]\npolicy = "fifo"\n', "bandwidth.policy"),
    ("[bandwidth]\nepoch_ms = 0\n", "bandwidth.epoch_ms"),
    ('[log]\nlevel = "chatty"\n', "log.level"),
    ("[compression]\ndecoded_copies_bytes = -2\n", "compression.decoded_copies_bytes"),
    ('[[tenants]]\nname = "a"\naccess_key = "k"\nsecret_key = "s"\nweight = 0\n', "tenants.weight"),
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


def test_nested_table_for_the_local_store(tmp_path):
    cfg = load_config(write(tmp_path, '[store]\ndata_dir = "/srv/oc"\n[store.local]\nio_threads = 4\n'), env={})
    assert cfg.store.data_dir == "/srv/oc" and cfg.store.local == LocalStoreConfig(io_threads=4)
    # TOML's dotted keys are the same table.
    assert load_config(write(tmp_path, "[store]\nlocal.io_threads = 5\n"), env={}).store.local.io_threads == 5
    assert load_config(env={}).store.local.io_threads == 16


def test_nested_environment_override(tmp_path):
    cfg = load_config(write(tmp_path, "[store.local]\nio_threads = 4\n"), env={"OBJECTCACHE_STORE_LOCAL_IO_THREADS": "8"})
    assert cfg.store.local.io_threads == 8
    assert load_config(env={"OBJECTCACHE_STORAGE_SERVER_READ_THREADS": "3"}).storage_server.read_threads == 3
    with pytest.raises(ConfigError, match="store.local.io_threads"):
        load_config(env={"OBJECTCACHE_STORE_LOCAL_IO_THREADS": "many"})


def test_environment_names_are_generated_from_the_schema():
    assert {"OBJECTCACHE_GATEWAY_PORT", "OBJECTCACHE_STORE_LOCAL_IO_THREADS", "OBJECTCACHE_STORAGE_SERVER_MAX_DESCRIPTOR_KEYS",
            "OBJECTCACHE_LOG_LEVEL", "OBJECTCACHE_TENANTS"} <= set(ENV_VARS)
    assert ENV_VARS["OBJECTCACHE_STORE_LOCAL_IO_THREADS"] == ("store", "local", "io_threads")


def test_keys_have_names_that_do_not_collide():
    cfg = load_config(env={})
    assert (cfg.gateway.max_list_keys, cfg.storage_server.max_descriptor_keys) == (1000, 65536)
    assert (cfg.store.local.io_threads, cfg.storage_server.read_threads) == (16, 0)


@pytest.mark.parametrize("old,new", [
    ("[gateway]\nmax_keys = 10\n", "gateway.max_list_keys"),
    ("[storage_server]\nmax_keys = 10\n", "storage_server.max_descriptor_keys"),
    ("[store]\nio_threads = 4\n", "store.local.io_threads"),
    ("[storage_server]\nio_threads = 4\n", "storage_server.read_threads"),
])
def test_old_key_names_are_refused_with_the_new_name(tmp_path, old, new):
    with pytest.raises(ConfigError, match=f"renamed to {new}"):
        load_config(write(tmp_path, old), env={})


def test_unknown_environment_variable_is_refused_naming_it():
    with pytest.raises(ConfigError, match="unknown environment variable OBJECTCACHE_GATEWAY_PROT .*OBJECTCACHE_GATEWAY_PORT"):
        load_config(env={"OBJECTCACHE_GATEWAY_PROT": "9100"})
    with pytest.raises(ConfigError, match="OBJECTCACHE_STORE_IO_THREADS .*renamed to OBJECTCACHE_STORE_LOCAL_IO_THREADS"):
        load_config(env={"OBJECTCACHE_STORE_IO_THREADS": "4"})
    # Variables without the prefix are none of the configuration's business.
    assert load_config(env={"TEST_AWS_CLI": "/usr/bin/aws", "OBJECTCACHEX": "1"}) == Config()


def test_log_level_is_an_ordinary_key():
    assert load_config(env={}).log.level == "WARNING"
    assert load_config(env={"OBJECTCACHE_LOG_LEVEL": "debug"}).log.level == "debug"


def test_sections_validate_themselves_when_built():
    with pytest.raises(ConfigError, match="gateway.port"):
        GatewayConfig(port=-1)
    with pytest.raises(ConfigError, match="store.local.io_threads"):
        LocalStoreConfig(io_threads=0)


def test_the_deploy_example_loads_once_its_keys_are_replaced(tmp_path):
    text = (REPO / "deploy" / "objectcache.example.toml").read_text()
    text = text.replace("REPLACE_WITH_ACCESS_KEY", "AKEXAMPLE0123").replace("REPLACE_WITH_SECRET_KEY", "s3cr3t-of-thirty-two-characters!")
    cfg = load_config(write(tmp_path, text), env={})
    assert cfg.store.local.io_threads == 16 and [t.name for t in cfg.tenants] == ["serving"]
    assert cfg.gateway.host == "0.0.0.0"


def test_the_deploy_example_as_shipped_is_refused_naming_tenant_and_key():
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "deploy" / "objectcache.example.toml", env={})
    assert "tenant 'serving'" in str(e.value) and "access_key" in str(e.value) and "REPLACE_WITH" in str(e.value)
    assert "0.0.0.0" in str(e.value)


EXPOSED_HOSTS = ["0.0.0.0", "::", "", "10.1.2.3", "gateway.example.internal"]
LOOPBACK_HOSTS = ["127.0.0.1", "127.9.9.9", "::1", "localhost", "LOCALHOST"]


def _tenant_config(tmp_path, host: str, access_key: str, secret_key: str):
    return write(tmp_path, f'[gateway]\nhost = "{host}"\n\n[[tenants]]\nname = "alice"\naccess_key = "{access_key}"\nsecret_key = "{secret_key}"\n')


@pytest.mark.parametrize("host", EXPOSED_HOSTS)
@pytest.mark.parametrize(("access_key", "secret_key", "named"), [
    ("REPLACE_WITH_ACCESS_KEY", "a-long-enough-secret-key", "access_key"),
    ("AKREAL", "REPLACE_WITH_SECRET_KEY", "secret_key"),
    ("AKREAL", "fifteen-chars!!", "secret_key is 15 characters"),
])
def test_an_exposed_gateway_refuses_placeholder_or_short_keys(tmp_path, host, access_key, secret_key, named):
    with pytest.raises(ConfigError) as e:
        load_config(_tenant_config(tmp_path, host, access_key, secret_key), env={})
    assert str(e.value).startswith("tenants: tenant 'alice': ") and named in str(e.value) and repr(host) in str(e.value)


@pytest.mark.parametrize("host", LOOPBACK_HOSTS)
def test_a_loopback_gateway_accepts_any_keys(tmp_path, host):
    cfg = load_config(_tenant_config(tmp_path, host, "REPLACE_WITH_ACCESS_KEY", "short"), env={})
    assert cfg.tenants[0].secret_key == "short"


def test_an_exposed_gateway_accepts_a_16_character_secret_and_env_tenants_are_checked_too(tmp_path):
    assert load_config(_tenant_config(tmp_path, "0.0.0.0", "AKREAL", "x" * 16), env={}).tenants[0].access_key == "AKREAL"
    with pytest.raises(ConfigError, match="tenant 'bob': secret_key is 5 characters"):
        load_config(env={"OBJECTCACHE_GATEWAY_HOST": "0.0.0.0", "OBJECTCACHE_TENANTS": "bob:AKBOB:short"})


def test_the_readme_table_lists_every_key_and_no_other():
    section = (REPO / "README.md").read_text().split("\n## Configuration\n")[1].split("\n## ")[0]
    documented: set[str] = set()
    for row in (line for line in section.splitlines() if line.startswith("| `")):
        first, *more = re.findall(r"`([^`]+)`", row.split("|")[1])
        if first == "[[tenants]]":
            documented |= {f"tenants.{k}" for k in more}
            continue
        # "`bandwidth.dispatch_slots`, `.burst_layers`" names two keys of one table.
        documented |= {first} | {first.rsplit(".", 1)[0] + k if k.startswith(".") else k for k in more}
    schema = {".".join(p) for p in ENV_VARS.values() if p != ("tenants",)} | {f"tenants.{f.name}" for f in fields(Tenant)}
    assert documented == schema


def test_operations_keys_are_checked_and_overridable():
    with pytest.raises(ConfigError, match="log.format"):
        load_config(env={"OBJECTCACHE_LOG_FORMAT": "xml"})
    with pytest.raises(ConfigError, match="metrics.gateway_port"):
        load_config(env={"OBJECTCACHE_METRICS_GATEWAY_PORT": "70000"})
    with pytest.raises(ConfigError, match="gateway.drain_timeout_s"):
        load_config(env={"OBJECTCACHE_GATEWAY_DRAIN_TIMEOUT_S": "-1"})
    cfg = load_config(env={"OBJECTCACHE_LOG_ACCESS": "false", "OBJECTCACHE_LOG_FORMAT": "json", "OBJECTCACHE_GATEWAY_DRAIN_TIMEOUT_S": "5",
                           "OBJECTCACHE_METRICS_STORAGE_SERVER_PORT": "9102"})
    assert (cfg.log.access, cfg.log.format, cfg.gateway.drain_timeout_s, cfg.metrics.storage_server_port) == (False, "json", 5.0, 9102)
    assert (cfg.metrics.host, cfg.metrics.gateway_port, cfg.storage_server.drain_timeout_s) == ("127.0.0.1", 0, 30.0)


def test_the_rdma_engine_is_configuration_with_an_environment_override():
    assert load_config(env={}).storage_server.rdma_engine == "nixl"
    assert load_config(env={"OBJECTCACHE_STORAGE_SERVER_RDMA_ENGINE": "pyverbs"}).storage_server.rdma_engine == "pyverbs"
    with pytest.raises(ConfigError, match="storage_server.rdma_engine: must be one of nixl, pyverbs"):
        load_config(env={"OBJECTCACHE_STORAGE_SERVER_RDMA_ENGINE": "ucx"})


def test_decoded_copies_are_on_by_default_within_a_quarter_of_the_cache_and_an_explicit_budget_wins(tmp_path):
    from protocol.config.sections import DEFAULT_DECODED_COPIES_BYTES

    assert load_config(env={}).compression.copies_budget(100 << 30) == DEFAULT_DECODED_COPIES_BYTES
    assert load_config(env={}).compression.copies_budget(1 << 30) == 256 << 20  # a small cache: a quarter of it
    assert load_config(write(tmp_path, "[compression]\ndecoded_copies_bytes = 0\n"), env={}).compression.copies_budget(100 << 30) == 0
    explicit = load_config(write(tmp_path, "[compression]\ndecoded_copies_bytes = 12345\n"), env={}).compression
    assert explicit.copies_budget(1 << 20) == 12345
