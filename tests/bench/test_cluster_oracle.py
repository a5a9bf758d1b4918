"""bench cluster's oracle case, its pure parts: the replayed requests share prefixes, and keys follow blocks."""

from __future__ import annotations

from bench.cluster_oracle import keys_of, node_toml, trace_requests
from bench.harness import llama_layout
from protocol.config import ClusterConfig


def test_replayed_requests_reuse_earlier_prefixes_and_shared_blocks_share_keys():
    reqs = trace_requests(30, 12)
    assert len(reqs) == 30 and all(1 <= len(r) <= 12 for r in reqs)
    later_turns = [r for i, r in enumerate(reqs) if any(r[: len(p)] == p for p in reqs[:i])]
    assert len(later_turns) >= 5  # reuse 0.6: some requests start with an earlier request's whole prefix
    layout = llama_layout(64, 512)
    a, b = keys_of([1, 2, 3], layout), keys_of([1, 2, 4], layout)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_each_node_config_is_a_valid_cluster_table_with_its_path_choice():
    import tomllib

    for mode in ("scheduler", "peer-first", "upstream"):
        table = tomllib.loads(node_toml("a", 1234, "k" * 40, mode, 16e6, 20.0, 1 << 20))["cluster"]
        ClusterConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}).validate()
        assert table["path_choice"] == mode and table["rack"] == "r-a" and table["zone"] == "z1"
