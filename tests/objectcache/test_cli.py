"""The `objectcache` command as a user runs it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pytest
from support import REPO, ServerProcess, TenantKeys, boto_client


def run_cli(*args: str, cwd=None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "objectcache", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd or REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **(env or {})})


def test_bad_config_refused_at_startup(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[gateway]\nprot = 9000\n")
    r = run_cli("serve", "--config", str(cfg))
    assert r.returncode == 2
    assert "prot" in r.stderr and "configuration error" in r.stderr


def test_unknown_environment_variable_refused_at_startup(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n')
    r = run_cli("serve", "--config", str(cfg), env={"OBJECTCACHE_GATEWAY_PROT": "9100"})
    assert r.returncode == 2
    assert "objectcache: configuration error: unknown environment variable OBJECTCACHE_GATEWAY_PROT" in r.stderr
    assert "OBJECTCACHE_GATEWAY_PORT" in r.stderr and not (tmp_path / "data").exists()


def test_serve_without_config_uses_printed_dev_credentials(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n')
    proc = ServerProcess(cfg).start()
    try:
        text = "".join(proc.output)
        ak = text.split("access key:")[1].split()[0]
        sk = text.split("secret key:")[1].split()[0]
        env_file = (tmp_path / "data" / "dev-credentials.env").read_text()
        assert f"AWS_ACCESS_KEY_ID={ak}" in env_file and f"AWS_SECRET_ACCESS_KEY={sk}" in env_file
        s3 = boto_client(proc.endpoint, TenantKeys("dev", ak, sk))
        s3.create_bucket(Bucket="devbucket")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["devbucket"]
        assert proc.stop(signal.SIGTERM) == 0
        # Restarting on the same data directory keeps the same keys and the data.
        proc.start()
        again = "".join(proc.output)
        assert again.count(f"access key:     {ak}") == 2
        assert [b["Name"] for b in boto_client(proc.endpoint, TenantKeys("dev", ak, sk)).list_buckets()["Buckets"]] == ["devbucket"]
        assert proc.stop(signal.SIGINT) == 0
    finally:
        if proc.proc.poll() is None:
            proc.kill()


def test_storage_server_alone_answers_rpc(tmp_path):
    sock_path = tmp_path / "ss.sock"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n[storage_server]\nsocket = "{sock_path}"\n')
    proc = ServerProcess(cfg, command="storage-server").start()
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock_path))
            s.sendall(b'{"op": "ping"}\n{"op": "nope"}\n')
            f = s.makefile("rb")
            assert json.loads(f.readline()) == {"ok": True, "pong": True}
            err = json.loads(f.readline())
            assert err["ok"] is False and err["error"]["code"] == "InvalidRequest" and "nope" in err["error"]["message"]
    finally:
        assert proc.stop() == 0


def _env_file(path) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in path.read_text().splitlines() if line.startswith("export "))


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_port_0_records_the_port_the_gateway_bound_in_dev_credentials(tmp_path, command):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n')
    storage = ServerProcess(cfg, command="storage-server").start() if command == "gateway" else None
    proc = ServerProcess(cfg, command=command).start(port=0)
    try:
        assert proc.port != 0
        creds = _env_file(tmp_path / "data" / "dev-credentials.env")
        # Written before READY by the process that bound the port, so a user can source it at once.
        assert creds["AWS_ENDPOINT_URL"] == proc.endpoint == f"http://127.0.0.1:{proc.port}"
        assert (tmp_path / "data" / "dev-credentials.env").stat().st_mode & 0o777 == 0o600
        s3 = boto_client(creds["AWS_ENDPOINT_URL"], TenantKeys("dev", creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"]))
        s3.create_bucket(Bucket="from-env-file")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["from-env-file"]
    finally:
        assert proc.stop() == 0
        if storage is not None:
            assert storage.stop() == 0


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_busy_port_is_one_line_naming_it_and_a_failed_exit(tmp_path, command):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_cli(command, "--config", str(cfg), "--port", str(port))
    assert r.returncode != 0
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith(f"objectcache: port {port} is already in use ("), r.stdout + r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_the_deploy_example_with_its_placeholder_keys_does_not_start(command):
    r = run_cli(command, "--config", str(REPO / "deploy" / "objectcache.example.toml"))
    assert r.returncode == 2
    assert "objectcache: configuration error: tenants: tenant 'serving': access_key is the placeholder" in r.stderr
    assert "Traceback" not in r.stderr
