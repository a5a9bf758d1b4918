"""The compose file's nodes start without writing into the checkout (issue 23 item 8).

No Docker here: what can run without it does — the image's install commands in a scratch
directory laid out as the Dockerfile's COPY lines lay it out, and each node's command and
environment through the real command line and configuration loader.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml
from support import REPO

from objectcache.cli import _load, build_parser

DEPLOY = REPO / "deploy"
NODES = ("node-a", "node-b")


def _services() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]


def _substituted(value: object) -> str:
    return re.sub(r"\$\{(\w+)[^}]*\}", lambda m: {"OBJECTCACHE_TENANTS": "serving:SERVINGKEY0001:servingsecret0001"}.get(m[1], "stand-in-" + m[1]),
                  str(value))


def test_the_nodes_run_the_image_the_dockerfile_builds_and_mount_no_source():
    for name in NODES:
        node = _services()[name]
        build = node["build"]
        assert (DEPLOY / build["context"]).resolve() == REPO and (REPO / build["dockerfile"]).is_file()
        assert "pip" not in " ".join(node["command"]), "a node installs nothing when it starts"
        for volume in node.get("volumes", []):
            source = volume.split(":")[0]
            assert not source.startswith((".", "/")), f"{name} mounts {source} from the host (a read-only checkout cannot be built in place)"


def test_each_nodes_command_and_environment_load_through_the_real_cli_and_config():
    for name in NODES:
        node = _services()[name]
        argv = node["command"]
        assert argv[0] == "objectcache"
        args = build_parser().parse_args(argv[1:])
        cfg = _load(args, {k: _substituted(v) for k, v in node["environment"].items()})
        assert args.command == "serve" and (cfg.gateway.host, cfg.gateway.port) == ("0.0.0.0", 9000)
        assert cfg.store.backend == "s3" and [t.name for t in cfg.tenants] == ["serving"]
        # The data directory is a volume of the node's own, the directory the image gives its user.
        assert any(v.endswith(":" + str(cfg.store.data_dir)) for v in node["volumes"])
        assert re.search(rf"install -d -o objectcache -g objectcache -m 0755 {re.escape(str(cfg.store.data_dir))}\b",
                         (REPO / "Dockerfile").read_text())


def test_the_images_install_commands_run_in_a_scratch_directory(tmp_path):
    """The Dockerfile's WORKDIR, COPY and RUN pip lines, replayed (offline: no dependencies, this setuptools)."""
    dockerfile = (REPO / "Dockerfile").read_text()
    workdir = tmp_path / re.search(r"^WORKDIR (\S+)$", dockerfile, re.M)[1].lstrip("/")
    workdir.mkdir(parents=True)
    for line in re.findall(r"^COPY (.+)$", dockerfile, re.M):
        *sources, dest = line.split()
        for source in sources:
            target = workdir / dest / source if dest.endswith("/") or dest == "./" else workdir / dest
            src = REPO / source
            if src.is_dir():
                shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(src.read_bytes())
    runs = [shlex.split(r) for r in re.findall(r"^RUN (pip install .+)$", dockerfile, re.M)]
    assert runs == [["pip", "install", "."]], runs
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                        "--target", str(site), "."], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{sysconfig.get_paths()['purelib']}"}
    r = subprocess.run([sys.executable, "-m", "objectcache", "serve", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--data-dir" in r.stdout, r.stderr
    assert Path(site / "objectcache" / "cli.py").is_file() and (site / "bin" / "objectcache").is_file()
