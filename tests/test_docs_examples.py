"""The examples a first-time user copies must work.

Every bucket they name is a valid S3 bucket name, and every README code block is either run here as
written — against a real ``objectcache serve`` with its generated dev tenant, from a directory laid
out like a checkout after ``make serve`` (``data/``, ``.venv``, ``.venv-aws``) — or listed below
with the reason it is not (and the test that covers it instead).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO, ServerProcess

from gateway.s3api.context import validate_bucket_name
from protocol.errors import S3Error

# Files whose examples users copy: the README, the SDK's docstring, the runnable examples.
EXAMPLE_FILES = ["README.md", "client_sdk/__init__.py", *(str(p.relative_to(REPO)) for p in (REPO / "client_sdk" / "examples").glob("*.py"))]
BUCKET_ARG = re.compile(r"""\b[Bb]ucket\s*=\s*["']([^"']*)["']|\bs3://([^/\s"'`]+)|--bucket(?:\s+|=)([A-Za-z0-9.-]+)|--bucket",\s*default=["']([^"']*)["']""")


def bucket_names(text: str) -> list[str]:
    return [next(g for g in m.groups() if g is not None) for m in BUCKET_ARG.finditer(text)]


def test_the_pattern_finds_what_it_should():
    assert bucket_names('s3.create_bucket(Bucket="kv")\nbucket="kv-cache"\naws s3 mb s3://demo\n--bucket demo') == ["kv", "kv-cache", "demo", "demo"]


@pytest.mark.parametrize("path", EXAMPLE_FILES)
def test_every_example_bucket_name_is_valid(path):
    names = bucket_names((REPO / path).read_text())
    bad = []
    for name in names:
        try:
            validate_bucket_name(name)
        except S3Error:
            bad.append(name)
    assert not bad, f"{path} names invalid S3 bucket(s) {bad}: 3-63 characters of a-z, 0-9, '.' and '-'"


def test_the_readme_examples_name_buckets_at_all():
    assert {"kv-cache", "demo"} <= set(bucket_names((REPO / "README.md").read_text()))


# -- every README code block: run, or the reason it is not ------------------------------------------

@dataclass(frozen=True)
class Block:
    section: str  # the nearest heading above it
    index: int  # its position within that section
    lang: str
    text: str


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    section, count, inside, lang, indent, lines = "", 0, False, "", "", []
    for line in (REPO / "README.md").read_text().splitlines():
        fence = re.match(r"^(\s*)```(\w*)\s*$", line)
        if not inside and line.startswith("#"):
            section, count = line.lstrip("#").strip(), 0
        elif fence and not inside:
            inside, indent, lang, lines = True, fence.group(1), fence.group(2), []
        elif fence and inside and fence.group(1) == indent:
            blocks.append(Block(section, count, lang, "\n".join(x[len(indent):] for x in lines) + "\n"))
            count, inside = count + 1, False
        elif inside:
            lines.append(line)
    return blocks


# (section, index) -> how it runs here.
RUN = {
    ("Using it with aws-cli", 0): "sh",
    ("Using it with boto3", 0): "python",
    ("Using it from serving code (client SDK)", 0): "python",
    ("Using it from serving code (client SDK)", 1): "sh",
}
# (section, index) -> why it is not run here, and what covers it.
NOT_RUN = {
    ("Quick start", 0): "`make serve`/`make test` build environments; the fixture below starts the same `objectcache serve`",
    ("Using it with vLLM / LMCache", 0): "needs a model; tests/client_sdk/test_vllm_connector.py runs a real engine with the connector",
    ("Using it with vLLM / LMCache", 1): "an LMCache configuration; tests/client_sdk/test_lmcache_plugin.py",
    ("Architecture", 0): "a diagram",
    ("The rdma transport", 0): "a fragment inside a running client; tests/client_sdk/test_kv_rdma.py",
    ("Bandwidth scheduling", 0): "a fragment of the scheduler's API; tests/scheduler/test_policies.py",
    ("Choosing the path (delivery-time oracle and path scheduler)", 0): "a fragment of the scheduler's API; tests/scheduler/test_paths.py",
    ("Asking a node: `kv-estimate`", 0): "the request's JSON; tests/protocol/test_estimate.py decodes it",
    ("Asking a node: `kv-estimate`", 1): "the answer's JSON; tests/protocol/test_estimate.py decodes it",
    ("Asking a node: `kv-estimate`", 2): "needs a cluster; tests/storage_server/test_kv_estimate.py makes the same SDK call on two real nodes",
    ("Nodes that share their caches (`[cluster]`)", 0): "a diagram",
    ("Nodes that share their caches (`[cluster]`)", 1): "a [cluster] table; tests/storage_server/test_cluster.py runs real nodes",
    ("Running it as a service", 0): "the commands' synopsis; tests/objectcache/test_cli.py",
    ("Operating it", 0): "installs system-wide as root; tests/objectcache/test_install.py runs `make install DESTDIR=...`",
    ("Scaling out", 0): "a diagram",
    ("Scaling out", 1): "loaded through the real config loader below",
}


def test_every_readme_block_is_run_or_says_why_not():
    ids = {(b.section, b.index) for b in readme_blocks()}
    unaccounted = sorted(ids - RUN.keys() - NOT_RUN.keys())
    assert not unaccounted, f"README blocks neither run by this test nor listed in NOT_RUN with a reason: {unaccounted}"
    assert not (RUN.keys() | NOT_RUN.keys()) - ids, "RUN/NOT_RUN name blocks the README no longer has"


def test_the_scaling_out_toml_is_a_valid_configuration(tmp_path):
    from protocol.config import load_config

    text = next(b.text for b in readme_blocks() if (b.section, b.index) == ("Scaling out", 1))
    tomllib.loads(text)
    path = tmp_path / "node.toml"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.store.backend == "s3" and cfg.cache.max_bytes == 107374182400


def _wrapper(path: Path, exe: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec "{exe}" "$@"\n')
    path.chmod(0o755)


def _sourced(env_file: Path) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines() if line.startswith("export "))


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A directory laid out like a checkout after ``make serve``, with the server running on ``data/``."""
    aws = os.environ.get("TEST_AWS_CLI") or shutil.which("aws")
    if not aws:
        pytest.fail("aws-cli not found: run the tests with `make test`, which installs it into .venv-aws")
    home = tmp_path_factory.mktemp("checkout")
    _wrapper(home / ".venv" / "bin" / "python", sys.executable)
    _wrapper(home / ".venv-aws" / "bin" / "aws", aws)
    config = home / "c.toml"
    config.write_text(f'[store]\ndata_dir = "{home / "data"}"\n[storage_server]\nsocket = "{home / "ss.sock"}"\n')
    server = ServerProcess(config).start(port=0)
    yield home
    server.stop()


def _run(block: Block, home: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(REPO),
           "AWS_CONFIG_FILE": str(home / "aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(home / "aws-credentials")}
    if RUN[(block.section, block.index)] == "sh":
        argv = ["bash", "-euo", "pipefail", "-c", block.text]
    else:  # as the README says: `source data/dev-credentials.env`, then `.venv/bin/python`
        env.update(_sourced(home / "data" / "dev-credentials.env"))
        argv = [str(home / ".venv" / "bin" / "python"), "-c", block.text]
    return subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("block", [b for b in readme_blocks() if (b.section, b.index) in RUN], ids=lambda b: f"{b.section}[{b.index}]")
def test_the_readme_block_runs_as_written(block, checkout):
    r = _run(block, checkout)
    assert r.returncode == 0, f"README block in {block.section!r} failed ({r.returncode}):\n{block.text}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    if block.section == "Using it with boto3":
        assert r.stdout.strip() == "b'wor'"
    if block.section == "Using it with aws-cli":
        assert "hello, kv cache" in r.stdout
