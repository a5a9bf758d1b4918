"""Package boundaries: who may import whom (checked in fresh interpreters, so nothing is preloaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO

PROJECT = ("protocol", "gateway", "storage_server", "client_sdk", "scheduler", "bench", "objectcache")


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def project_packages(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules if m.split(".")[0] in PROJECT}


def test_the_client_sdk_loads_neither_the_server_nor_the_gateway():
    assert project_packages(loaded_after("import client_sdk")) == {"client_sdk", "protocol"}


@pytest.mark.parametrize("module", ["protocol.errors", "protocol.wire", "protocol.rpc", "protocol.kv_http", "protocol.shm",
                                    "protocol.checksums", "protocol.config", "protocol.verbs", "protocol.pyverbs_device"])
def test_the_contract_package_imports_nothing_of_the_project(module):
    assert project_packages(loaded_after(f"import {module}")) == {"protocol"}


def test_storage_server_help_loads_no_benchmark_harness_numpy_or_aiobotocore():
    code = "import sys\nfrom objectcache.cli import main\ntry:\n    main(['storage-server', '--help'])\nexcept SystemExit:\n    pass"
    loaded = loaded_after(code)
    assert not {"bench", "numpy", "aiobotocore"} & {m.split(".")[0] for m in loaded}


def test_nothing_imports_the_cli_package():
    """Except ``objectcache.lifeline`` (children tied to their parent's life, no project imports of its own): ``serve``
    needs it for its two processes and the bench harness for the servers it starts."""
    def imports_cli(text: str) -> bool:
        text = text.replace("from objectcache.lifeline import", "")
        return "from objectcache" in text or "import objectcache" in text

    offenders = [str(p.relative_to(REPO)) for pkg in PROJECT if pkg != "objectcache" for p in (REPO / pkg).rglob("*.py")
                 if imports_cli(p.read_text())]
    assert offenders == []


def test_the_lifeline_imports_nothing_of_the_project():
    assert project_packages(loaded_after("import objectcache.lifeline")) <= {"objectcache"}


def test_no_production_module_carries_test_hooks():
    words = ("test-hold", "test_hooks", "TestGate", "GatePacer")
    offenders = [str(p.relative_to(REPO)) for pkg in PROJECT for p in (REPO / pkg).rglob("*.py") if any(w in p.read_text() for w in words)]
    assert offenders == []
