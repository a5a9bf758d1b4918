"""`objectcache bench faults --quick`: the fault run finishes and every acknowledged byte survives."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO


def test_quick_fault_run_loses_nothing(tmp_path):
    out = tmp_path / "faults.json"
    r = subprocess.run([sys.executable, "-m", "objectcache", "bench", "faults", "--quick", "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    mixed, kills, crash = result["mixed_load"], result["storage_server_kills"], result["tree_killed_mid_put"]
    assert mixed["mismatches"] == 0 and mixed["errors"] == 0 and mixed["objects"] > 0 and mixed["kv_fetches"] > 0
    assert kills["client_errors"] == ["ServiceUnavailable"] * kills["kills"]
    assert len(kills["recovery_s"]) == kills["kills"]  # KV service came back after every kill
    assert crash["acknowledged"] > 0 and crash["intact"] == crash["acknowledged"] and crash["lost"] == 0 and crash["torn_visible"] == 0
    disk = result["disk_full"]
    if "skipped" in disk:  # said to pytest, so a run that never filled a disk is not reported as a pass
        pytest.skip(f"the disk-full fault did not run: {disk['skipped']} (the other faults passed)")
    assert disk["consistent"] and 507 in {int(k) for k in disk["statuses"]}
