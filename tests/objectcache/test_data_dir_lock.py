"""One server per data directory (issue 23 item 1): a second one is refused before it writes anything."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request

import pytest
from support import REPO, ServerProcess, TenantKeys, boto_client


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "objectcache", *args], capture_output=True, text=True, timeout=30,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def _creds(path) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in path.read_text().splitlines() if line.startswith("export "))


def _snapshot(data):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in data.iterdir() if p.name != "objectcache.lock"}


@pytest.mark.parametrize("second", ["serve", "storage-server"])
def test_a_second_server_on_the_same_data_directory_is_refused_and_the_first_keeps_serving(tmp_path, second):
    data = tmp_path / "data"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{data}"\n')
    first = ServerProcess(cfg).start(port=0)
    try:
        creds_file = data / "dev-credentials.env"
        before, files = creds_file.read_text(), _snapshot(data)
        args = [second, "--config", str(cfg)] + (["--port", "0"] if second == "serve" else [])
        r = run_cli(*args)
        assert r.returncode == 3, r.stdout + r.stderr
        lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert str(data) in lines[0] and f"pid {first.proc.pid}" in lines[0], lines[0]
        # It wrote nothing: the credentials still name the first server's port, the socket is the first one's.
        assert creds_file.read_text() == before and _snapshot(data) == files
        assert _creds(creds_file)["AWS_ENDPOINT_URL"] == first.endpoint
        with urllib.request.urlopen(first.endpoint + "/ready", timeout=10) as resp:
            assert resp.status == 200
        c = _creds(creds_file)
        s3 = boto_client(first.endpoint, TenantKeys("dev", c["AWS_ACCESS_KEY_ID"], c["AWS_SECRET_ACCESS_KEY"]))
        s3.create_bucket(Bucket="still-mine")
    finally:
        assert first.stop() == 0
    # The lock died with its holder: the directory can be served again at once.
    again = ServerProcess(cfg).start(port=0)
    assert again.stop() == 0


def test_the_lock_is_released_by_the_kernel_when_the_server_is_killed(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n')
    first = ServerProcess(cfg).start(port=0)
    first.kill()
    again = ServerProcess(cfg).start(port=0)
    assert again.stop() == 0


def test_a_server_that_cannot_bind_its_port_writes_no_credentials(tmp_path):
    data = tmp_path / "data"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{data}"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = run_cli("serve", "--config", str(cfg), "--port", str(busy.getsockname()[1]))
    assert r.returncode == 3, r.stdout + r.stderr
    assert not (data / "dev-credentials.env").exists()
