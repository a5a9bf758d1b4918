"""``make install`` lays out what the systemd units expect, and systemd accepts the units on that
layout (issue 23 item 7); the install never writes into the source it installs from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support import REPO

UNITS = ("objectcache-storage-server.service", "objectcache-gateway.service")


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``make install DESTDIR=...`` from a copy of the checkout (offline: the wheel is built with this
    interpreter's setuptools and installed without dependencies; the venv gets no pip of its own, since
    ensurepip took most of this test's ~80 s on a loaded 2-core machine, and this interpreter's pip installs into it)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv*", "data", ".git", "__pycache__", "*.egg-info", "build", "docs"))
    before = _tree(src)
    root = tmp / "root"
    env = {**os.environ, "BUILD_OPTIONS": "--no-build-isolation", "PIP_OPTIONS": "--no-deps --no-index", "VENV_OPTIONS": "--without-pip"}
    r = subprocess.run(["make", "-C", str(src), "install", f"DESTDIR={root}", f"PYTHON={sys.executable}"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return root, before, _tree(src)


def test_the_install_lays_out_the_documented_layout(installed):
    root, before, after = installed
    exe = root / "opt/objectcache/.venv/bin/objectcache"
    assert exe.is_file() and os.access(exe, os.X_OK)
    config = root / "etc/objectcache/objectcache.toml"
    assert config.read_text() == (REPO / "deploy/objectcache.example.toml").read_text() and config.stat().st_mode & 0o777 == 0o640
    for unit in UNITS:
        assert (root / "etc/systemd/system" / unit).read_text() == (REPO / "deploy/systemd" / unit).read_text()
        assert "/opt/objectcache/.venv/bin/objectcache" in (root / "etc/systemd/system" / unit).read_text()
        assert "--config /etc/objectcache/objectcache.toml" in (root / "etc/systemd/system" / unit).read_text()
    assert after == before, "the install wrote into its source tree"
    # The installed command runs (its dependencies come from this test environment: the venv got --no-deps).
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    r = subprocess.run([str(exe), "storage-server", "--help"], capture_output=True, text=True, timeout=60, env=env, cwd=root)
    assert r.returncode == 0 and "--data-dir" in r.stdout, r.stderr


def test_systemd_accepts_the_units_on_the_installed_layout(installed):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    root, _, _ = installed
    system = Path("/usr/lib/systemd/system")
    if not (system / "sysinit.target").exists():
        pytest.skip("no distribution unit directory to verify against")
    units = root / "usr/lib/systemd"
    if not units.exists():
        units.mkdir(parents=True)
        shutil.copytree(system, units / "system", symlinks=True)  # the targets the units order against
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *UNITS], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr
