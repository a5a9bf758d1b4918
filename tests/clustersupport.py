"""Clusters of real ObjectCache nodes (``objectcache serve`` processes) over one upstream, for tests and ``bench cluster``."""

from __future__ import annotations

import json
import secrets
import socket
import time
from pathlib import Path

from support import ServerProcess, TenantKeys, free_port, start_together

REGISTRY = "oc-cluster-registry"


def cluster_key() -> str:
    return secrets.token_urlsafe(33)


def node_config(root: Path, name: str, upstream, tenants: list[TenantKeys], key: str, port: int, *,
                peers: dict[str, int] | None = None, registry: bool = True, cache_bytes: int = 1 << 30, **cluster: object) -> Path:
    """A node with the s3 backend over ``upstream`` and a ``[cluster]`` table (its peer listener on ``port``)."""
    # Generous deadlines and liveness: on a loaded 2-core CI a 2 s lookup deadline expired, and a peer whose heartbeat
    # rounds lag behind a busy moto must not drop out of the live set mid-test, or the kv-get falls back to the upstream
    # (the paths a test counts must not depend on speed). A dead peer left "live" costs one refused connection, not
    # bytes; tests of timeouts and departures set their own. A peer's first write into a new engine (its NIXL agent
    # loaded, a UCX connection made) took over 10 s at load 50: a peer's stall bound is 30 s here, not what is tested.
    # The upstream is declared far (1 s to each GET's first byte): the path scheduler then prefers a peer's cache to
    # the upstream whatever the measured peer rates on a loaded machine, as the tests that count paths assume (the
    # choices themselves are tested as pure functions in test_cluster_paths and tests/scheduler).
    settings = {"heartbeat_s": 1.0, "missed_heartbeats": 30, "lookup_timeout_s": 10.0, "peer_timeout_s": 30.0,
                "upstream_first_byte_ms": 1000.0, **cluster}
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
    static = json.dumps([f"{n}=127.0.0.1:{p}" for n, p in (peers or {}).items()])
    text = (f'[store]\nbackend = "s3"\ndata_dir = "{root / (name + "-data")}"\n{upstream.config()}'
            f"[cache]\nmax_bytes = {cache_bytes}\nfetch_concurrency = 4\n"
            f'[storage_server]\nsocket = "{root / name}.sock"\ndata_listen = "127.0.0.1:0"\n'
            f'[cluster]\nnode_id = "{name}"\nlisten = "127.0.0.1:{port}"\nkey = "{key}"\npeers = {static}\n'
            f'registry_bucket = "{REGISTRY if registry else ""}"\n{extra}')
    text += "".join(f'[[tenants]]\nname = "{t.name}"\naccess_key = "{t.access_key}"\nsecret_key = "{t.secret_key}"\n' for t in tenants)
    path = root / f"{name}.toml"
    path.write_text(text)
    return path


def node_process(root: Path, name: str, upstream, tenants: list[TenantKeys], key: str, **kw) -> ServerProcess:
    """A node's :class:`ServerProcess`, configured but not started (see :func:`start_nodes`)."""
    port = kw.pop("port", None) or free_port()
    node = ServerProcess(node_config(root, name, upstream, tenants, key, port, **kw))
    node.rpc_socket = str(root / f"{name}.sock")
    node.peer_port = port  # type: ignore[attr-defined]
    return node


def start_node(root: Path, name: str, upstream, tenants: list[TenantKeys], key: str, **kw) -> ServerProcess:
    return node_process(root, name, upstream, tenants, key, **kw).start()


def start_nodes(root: Path, upstream, tenants: list[TenantKeys], key: str, settings: dict[str, dict]) -> dict[str, ServerProcess]:
    """Nodes named by ``settings`` (each name's own ``start_node`` keywords), started side by side and returned
    once each sees the others live."""
    nodes = {n: node_process(root, n, upstream, tenants, key, **kw) for n, kw in settings.items()}
    start_together(list(nodes.values()))
    try:
        for name, n in nodes.items():  # all started at once: each first sees the others once their first heartbeats land
            wait_live(n, set(nodes) - {name}, timeout_s=60.0)
    except AssertionError as e:
        seen = "\n".join(f"--- node {name}:\n{diagnose(n)}" for name, n in nodes.items())
        for n in nodes.values():
            n.stop()
        raise AssertionError(f"{e}\n{seen}") from e
    return nodes


def start_trio(root: Path, upstream, tenants: list[TenantKeys], key: str, **a_settings: object) -> dict[str, ServerProcess]:
    """Nodes a, b and c over ``upstream`` finding each other through the registry (``a_settings``: node a's own
    ``[cluster]`` settings), returned once each sees the other two live."""
    return start_nodes(root, upstream, tenants, key, {"a": a_settings, "b": {}, "c": {}})


def status(node: ServerProcess) -> dict:
    """The node's storage-server status (operator RPC over its Unix socket)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(node.rpc_socket)
        s.sendall(json.dumps({"op": "status"}).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def wait_for(check, timeout_s: float = 20.0, what: str = "condition"):
    """Poll ``check`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def diagnose(node: ServerProcess) -> str:
    """What a failed cluster assertion shows: the node's log lines other than access lines, and its cluster status."""
    lines = [line for line in node.output if "objectcache.access" not in line]
    try:
        cluster = json.dumps(status(node)["cluster"], default=str)[:4000]
    except OSError as e:
        cluster = f"(status unavailable: {e})"
    return "".join(lines[-40:]) + "\ncluster status: " + cluster


def wait_live(node: ServerProcess, peers: set[str], timeout_s: float = 20.0) -> None:
    wait_for(lambda: peers <= set(status(node)["cluster"]["live_peers"]), timeout_s, what=f"{sorted(peers)} live on the node")
