"""The capacity tier's deployment files: what each node is told is a configuration ObjectCache loads, pointing at the upstream beside it.

Docker and a Kubernetes cluster are not available here, so these read the files as their
tools would (YAML, compose's merge keys and ``${VAR}`` substitution) and load every node's
environment through the real configuration loader.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import yaml
from support import REPO

from protocol.config import load_config

DEPLOY = REPO / "deploy"


def _substituted(value: object) -> str:
    """Compose's ``${VAR}`` / ``${VAR:?message}`` with a stand-in value, as an operator's environment would supply."""
    return re.sub(r"\$\{(\w+)[^}]*\}", lambda m: {"OBJECTCACHE_TENANTS": "serving:SERVINGKEY0001:servingsecret0001"}.get(m[1], "stand-in-" + m[1]),
                  str(value))


def test_compose_runs_two_nodes_with_their_own_caches_over_one_upstream():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    upstream_port = next(int(a.split("=", 1)[1]) for a in services["upstream"]["command"] if a.startswith("-s3.port="))
    caches = set()
    for name in ("node-a", "node-b"):
        node = services[name]
        cfg = load_config(env={k: _substituted(v) for k, v in node["environment"].items()})
        endpoint = urlsplit(cfg.store.s3.endpoint_url)
        assert cfg.store.backend == "s3" and (endpoint.hostname, endpoint.port) == ("upstream", upstream_port)
        assert "upstream" in node["depends_on"] and cfg.cache.max_bytes > 0 and [t.name for t in cfg.tenants] == ["serving"]
        cache = next(v.split(":")[0] for v in node["volumes"] if v.endswith(":" + str(cfg.store.data_dir)))
        caches.add(cache)
    assert len(caches) == 2  # each node its own cache volume


def test_kubernetes_puts_a_node_on_every_gpu_host_with_a_node_local_cache_in_front_of_the_upstream_service():
    docs = {d["kind"]: d for path in (DEPLOY / "kubernetes").glob("*.yaml") for d in yaml.safe_load_all(path.read_text()) if d}
    service, secret, pod = docs["Service"], docs["Secret"], docs["DaemonSet"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu.present" in pod["nodeSelector"] and pod["hostIPC"] and pod["hostNetwork"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e and e["name"].startswith("OBJECTCACHE_")} | secret["stringData"]
    cfg = load_config(env=env)
    endpoint = urlsplit(cfg.store.s3.endpoint_url)
    assert cfg.store.backend == "s3" and cfg.cache.max_bytes > 0
    assert endpoint.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert endpoint.port in [p["port"] for p in service["spec"]["ports"]]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "hostPath" in volumes[mounts[str(cfg.store.data_dir)]]  # the chunk cache on the host's own disk
    assert volumes[mounts["/dev/shm"]]["hostPath"]["path"] == "/dev/shm"  # shm transfers to engines on the host
