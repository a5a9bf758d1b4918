"""The deployment files run the nodes as a cluster: each loads a [cluster] config with its own id, a peer listener
peers can reach, the shared key and the upstream registry (read as their tools would, loaded by the real loader)."""

from __future__ import annotations

import pytest
import yaml
from support import REPO
from test_deploy import _substituted

from protocol.config import ConfigError, load_config

DEPLOY = REPO / "deploy"


def test_compose_runs_three_nodes_as_one_cluster():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    nodes = [n for n in services if n.startswith("node-")]
    assert len(nodes) == 3
    ids = set()
    for name in nodes:
        cfg = load_config(env={k: _substituted(v) for k, v in services[name]["environment"].items()}).cluster
        assert cfg.enabled and cfg.node_id == name and cfg.advertise == f"{name}:{cfg.listen.rsplit(':', 1)[1]}"
        assert cfg.registry_bucket and len(cfg.key) >= 32
        ids.add(cfg.node_id)
    assert len(ids) == 3


def test_the_daemonset_names_each_node_after_its_host_and_advertises_the_host_ip():
    docs = {d["kind"]: d for path in (DEPLOY / "kubernetes").glob("*.yaml") for d in yaml.safe_load_all(path.read_text()) if d}
    (container,) = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["OBJECTCACHE_CLUSTER_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert "topology.kubernetes.io/zone" in env["OBJECTCACHE_CLUSTER_ZONE"]["valueFrom"]["fieldRef"]["fieldPath"]
    # What the kubelet hands the container, with a node's values filled in.
    filled = {"OBJECTCACHE_CLUSTER_NODE_ID": "gpu-7", "OBJECTCACHE_CLUSTER_HOST": "gpu-7", "OBJECTCACHE_CLUSTER_ZONE": "eu-1a"}
    plain = {k: e["value"].replace("$(HOST_IP)", "10.0.0.7") for k, e in env.items() if "value" in e and k.startswith("OBJECTCACHE_")}
    secret = docs["Secret"]["stringData"]
    assert "REPLACE_WITH" in secret["OBJECTCACHE_CLUSTER_KEY"]  # a placeholder the loader refuses until replaced:
    with pytest.raises(ConfigError, match="cluster.key"):
        load_config(env=plain | filled | secret)
    cfg = load_config(env=plain | filled | secret | {"OBJECTCACHE_CLUSTER_KEY": "k" * 44})
    assert cfg.cluster.enabled and cfg.cluster.advertise == "10.0.0.7:9500" and cfg.cluster.zone == "eu-1a"
    assert cfg.cluster.registry_bucket and len(cfg.cluster.key) >= 32
