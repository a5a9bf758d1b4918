"""Fixtures that start real ObjectCache processes and hand out real clients."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

# NIXL/UCX (the rdma transport) on loopback only; the servers the tests start inherit this.
os.environ.setdefault("UCX_NET_DEVICES", "lo")
# Where the distribution's rdma-core is installed too, UCX's ib module crashes at process exit inside
# the libnl NIXL bundles; loopback never needs it.
if ctypes.util.find_library("ibverbs"):
    os.environ.setdefault("UCX_MODULES", "^ib")

# No per-example time limit anywhere: tests check correctness, never wall-clock time (a loaded 2-core machine
# once failed a descriptor fuzz example on hypothesis's default 200 ms deadline). CI runs the same examples every
# time; local runs explore new ones.
settings.register_profile("local", deadline=None)
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")

from inprocess import InProcessNode, LayerGate
from support import ServerProcess, TenantKeys, boto_client, make_tenants, write_config

# The modules that take longest (minutes on a loaded 2-core CI: vLLM engines, three-node clusters, benchmarks run
# --quick, a venv), run first. `make test` hands whole modules to pytest-xdist's workers (--dist loadfile: a module's
# servers start once, on one worker) in this order (--no-loadscope-reorder), so no long module starts last and
# leaves one worker idle while the other finishes it. Measure with `pytest --durations` when a module grows.
LONGEST_FIRST = (
    "tests/bench/test_bench_vllm.py",
    "tests/storage_server/test_cluster.py",
    "tests/bench/test_bench_smoke.py",
    "tests/bench/test_bench_compression.py",
    "tests/bench/test_bench_cluster.py",
    "tests/client_sdk/test_vllm_connector.py",
    "tests/storage_server/test_cluster_direct.py",
    "tests/objectcache/test_install.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Modules in ``LONGEST_FIRST`` first (in its order), every module's own tests in their order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = Path(str(config.rootpath))

    def key(item) -> int:
        try:
            return rank.get(Path(str(item.path)).relative_to(root).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=key)  # stable: the rest keep pytest's order


@pytest.fixture(scope="session")
def tenants() -> dict[str, TenantKeys]:
    return {t.name: t for t in make_tenants("alice", "bob", "carol", "dave")}


@pytest.fixture(scope="session")
def server(tmp_path_factory, tenants) -> ServerProcess:
    """One ``objectcache serve`` for the session: gateway + storage server, two tenants."""
    root = tmp_path_factory.mktemp("objectcache")
    config = write_config(root / "objectcache.toml", root / "data", list(tenants.values()),
                          extra=f'\n[storage_server]\nmax_descriptor_keys = 4096\nsocket = "{root / "ss.sock"}"\n')
    proc = ServerProcess(config).start()
    proc.rpc_socket = str(root / "ss.sock")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def gated_node(tmp_path_factory, tenants) -> InProcessNode:
    """A node in this process whose storage server takes its pacers from ``gated_node.gate`` (a :class:`LayerGate`).

    It has a data endpoint, so its http kv-gets go direct (the session ``server`` relays them)."""
    root = tmp_path_factory.mktemp("gated")
    config = write_config(root / "objectcache.toml", root / "data", list(tenants.values()),
                          extra=f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\ndata_listen = "127.0.0.1:0"\n')
    gate = LayerGate()
    node = InProcessNode(config, pacers=[gate]).start()
    node.gate = gate
    yield node
    node.stop()


@pytest.fixture(scope="session")
def s3(server, tenants):
    return boto_client(server.endpoint, tenants["alice"])


@pytest.fixture(scope="session")
def s3_bob(server, tenants):
    return boto_client(server.endpoint, tenants["bob"])


@pytest.fixture
def bucket(s3) -> str:
    """A fresh bucket owned by alice, emptied and removed afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    yield name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
    for u in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
        s3.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
    s3.delete_bucket(Bucket=name)


class AwsCli:
    """The real ``aws`` command, pointed at the test server as tenant alice."""

    def __init__(self, exe: str, endpoint: str, tenant: TenantKeys, home: Path) -> None:
        self.exe, self.endpoint = exe, endpoint
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "AWS_ACCESS_KEY_ID": tenant.access_key,
            "AWS_SECRET_ACCESS_KEY": tenant.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(home / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
        }

    def __call__(self, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
        argv = [self.exe, "--endpoint-url", self.endpoint, *args]
        r = subprocess.run(argv, env=self.env, capture_output=True, input=input, timeout=300)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout.decode()}\n{r.stderr.decode()}")
        return r


@pytest.fixture(scope="session")
def aws(server, tenants, tmp_path_factory) -> AwsCli:
    exe = os.environ.get("TEST_AWS_CLI") or shutil.which("aws")
    if not exe:
        pytest.fail("aws-cli not found: run the tests with `make test`, which installs it into .venv-aws")
    return AwsCli(exe, server.endpoint, tenants["alice"], tmp_path_factory.mktemp("awshome"))
