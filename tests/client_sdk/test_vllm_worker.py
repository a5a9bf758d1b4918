"""The vLLM connector's worker half on real paged KV tensors and a real node (torch, no vLLM engine).

The tensors have the exact layout of vLLM's CPU attention backend, ``[num_blocks, kv_heads,
block_size, 2·head_dim]`` with each block/head holding its K rows then its V rows; the expected
chunk bytes are computed here from that description with numpy, independently of the connector.
The in-process node's ``LayerGate`` holds a transfer before a layer, which shows the layer-ready
delivery: layer 0 is in vLLM's blocks and its wait returned while layer 1 is still held.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest
from kvsupport import rpc
from support import boto_client

from client_sdk import chunk_keys
from client_sdk.sync import SyncObjectCacheClient

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (pip install 'objectcache[vllm]'; make test does)")

LAYERS, BLOCKS, HEADS, T, D = 3, 8, 2, 32, 32
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def chunk_layer(cache: np.ndarray, block: int) -> np.ndarray:
    """KV_L2TD layer of one block, from the CPU layout's description: [2][T][H][D]."""
    kv = cache[block].reshape(HEADS, 2 * T, D)             # the backend's own view: K rows, then V rows
    return np.stack([kv[:, :T].transpose(1, 0, 2), kv[:, T:].transpose(1, 0, 2)])


@pytest.fixture
def parts(gated_node, tenants):
    import torch

    from client_sdk.vllm_connector.worker import WorkerSide

    alice = tenants["alice"]
    boto_client(gated_node.endpoint, alice).create_bucket(Bucket="vllm-worker")
    client = SyncObjectCacheClient(gated_node.endpoint, alice.access_key, alice.secret_key, "vllm-worker")

    def worker(timeout: float = 30.0, overlap: str = "layerwise"):
        caches = {n: torch.zeros(BLOCKS, HEADS, T, 2 * D, dtype=torch.float32) for n in NAMES}
        w = WorkerSide(client, T, "auto", timeout, mode="layerwise", overlap=overlap)
        w.register(caches, NAMES)
        return w, caches

    yield worker, client
    client.close()


def _save(worker, keys, blocks):
    import torch

    from client_sdk.vllm_connector.plan import ChunkTransfer

    w, caches = worker()
    g = torch.Generator().manual_seed(5)
    for c in caches.values():
        c.copy_(torch.randn(c.shape, generator=g))
    w.begin_saves([ChunkTransfer("r", tuple(keys), tuple(blocks))])
    for n in NAMES:
        w.save_layer(n)
    w.finish_step()
    w.flush()
    return {n: c.numpy().copy() for n, c in caches.items()}


def test_saved_chunks_are_the_blocks_in_kv_l2td_order(parts):
    worker, client = parts
    keys = chunk_keys(np.arange(3 * T), T, "worker-save")
    saved = _save(worker, keys, [5, 2, 7])
    payload, _ = client.fetch(keys, worker()[0].layout, "http")
    for layer, name in enumerate(NAMES):
        got = payload[layer].view(np.float32).reshape(3, 2, T, HEADS, D)
        for j, block in enumerate([5, 2, 7]):
            assert np.array_equal(got[j], chunk_layer(saved[name], block)), (layer, j)


def test_each_layer_is_in_the_blocks_when_its_wait_returns_while_later_layers_still_move(parts, gated_node):
    worker, client = parts
    keys = chunk_keys(np.arange(3 * T) + 1, T, "worker-load")
    saved = _save(worker, keys, [5, 2, 7])
    from client_sdk.vllm_connector.plan import ChunkTransfer

    w, caches = worker()
    gated_node.gate.hold_before(1)
    w.start_load([ChunkTransfer("r", tuple(keys), (1, 3, 4))])
    w.wait_for_layer(NAMES[0])
    assert gated_node.gate.wait_held(), "the transfer was not held before layer 1"
    for j, (src, dst) in enumerate([(5, 1), (2, 3), (7, 4)]):
        assert np.array_equal(caches[NAMES[0]][dst].numpy(), saved[NAMES[0]][src]), j
    assert not caches[NAMES[1]].any(), "layer 1 landed while the server held it"
    gated_node.gate.open()
    for name in NAMES[1:]:
        w.wait_for_layer(name)
    assert w.failed_blocks() == set() and w.stats["loaded_chunks"] == 3
    for name in NAMES:
        for src, dst in [(5, 1), (2, 3), (7, 4)]:
            assert np.array_equal(caches[name][dst].numpy(), saved[name][src])
        untouched = [b for b in range(BLOCKS) if b not in (1, 3, 4)]
        assert not caches[name][untouched].any()


def test_on_the_cpu_backend_attention_starts_once_the_whole_load_is_in_place(parts, gated_node):
    """``overlap = "auto"`` with the KV cache in host memory: layer 0's wait returns only after the last layer landed."""
    import threading

    worker, client = parts
    keys = chunk_keys(np.arange(3 * T) + 11, T, "worker-whole")
    saved = _save(worker, keys, [5, 2, 7])
    from client_sdk.vllm_connector.plan import ChunkTransfer

    w, caches = worker(overlap="auto")
    gated_node.gate.hold_before(2)
    w.start_load([ChunkTransfer("r", tuple(keys), (1, 3, 4))])
    waiting = threading.Thread(target=w.wait_for_layer, args=(NAMES[0],))
    waiting.start()
    assert gated_node.gate.wait_held(), "the transfer was not held before layer 2"
    waiting.join(0.5)
    assert waiting.is_alive(), "layer 0's wait returned while layer 2 was still held"
    gated_node.gate.open()
    waiting.join(30)
    assert not waiting.is_alive()
    for name in NAMES:  # every layer in place by then
        for src, dst in [(5, 1), (2, 3), (7, 4)]:
            assert np.array_equal(caches[name][dst].numpy(), saved[name][src])
    assert w.failed_blocks() == set()


def test_two_requests_sharing_a_prefix_fetch_it_once_into_both_requests_blocks(parts):
    worker, _ = parts
    keys = chunk_keys(np.arange(2 * T) + 7, T, "worker-shared")
    saved = _save(worker, keys, [5, 2])
    from client_sdk.vllm_connector.plan import ChunkTransfer

    w, caches = worker()
    w.start_load([ChunkTransfer("a", tuple(keys), (0, 1)), ChunkTransfer("b", tuple(keys), (3, 6))])
    for name in NAMES:
        w.wait_for_layer(name)
    assert w.failed_blocks() == set()
    for name in NAMES:
        for src, dst in [(5, 0), (2, 1), (5, 3), (2, 6)]:
            assert np.array_equal(caches[name][dst].numpy(), saved[name][src])


def test_a_missing_chunk_fails_the_load_and_reports_its_blocks(parts):
    worker, _ = parts
    from client_sdk.vllm_connector.plan import ChunkTransfer

    w, caches = worker()
    w.start_load([ChunkTransfer("r", ("worker/never-stored",), (6,))])
    for name in NAMES:
        w.wait_for_layer(name)
    assert w.failed_blocks() == {6} and w.stats["failed_loads"] == 1
    assert w.failed_blocks() == set()  # reported once
    assert not any(c.any() for c in caches.values())


@pytest.mark.parametrize("bound", ["load_timeout_s", "load budget"])
def test_a_layer_late_past_the_timeout_fails_the_load_and_never_lands_afterwards(parts, gated_node, bound):
    """Stalled mid-transfer: the per-layer timeout, or the request's load budget (the deadline of the whole load)."""
    worker, _ = parts
    keys = chunk_keys(np.arange(2 * T) + 2, T, f"worker-late-{bound}")
    _save(worker, keys, [0, 1])
    from client_sdk.vllm_connector.plan import ChunkTransfer

    w, caches = worker(timeout=0.5) if bound == "load_timeout_s" else worker()
    gated_node.gate.hold_before(1)
    w.start_load([ChunkTransfer("r", tuple(keys), (2, 3), budget_s=None if bound == "load_timeout_s" else 0.5)])
    w.wait_for_layer(NAMES[0])
    assert caches[NAMES[0]][[2, 3]].any()
    w.wait_for_layer(NAMES[1])  # held by the server: gives up after 0.5 s
    job = w._load
    assert w.failed_blocks() == {2, 3}
    gated_node.gate.open()
    # Events, not a pause: the server has ended the transfer (nothing more can arrive) and the
    # client's fetch has finished (nothing more can be scattered), then nothing of layers 1, 2 is there.
    deadline = time.monotonic() + 30
    while rpc(gated_node.rpc_socket, "status")["transfers_active"] or not job.future.done():
        assert time.monotonic() < deadline, "the held transfer never ended"
        time.sleep(0.01)
    assert not caches[NAMES[1]].any() and not caches[NAMES[2]].any(), "a layer landed after the load was given up"


def test_with_the_whole_load_first_one_timeout_fails_the_load(parts, gated_node):
    """Stalled after layer 0 landed: layer 0's wait (for the last layer) gives up once, and the load is failed then, not
    after one more timeout per layer that had landed."""
    worker, _ = parts
    keys = chunk_keys(np.arange(2 * T) + 5, T, "worker-whole-late")
    _save(worker, keys, [0, 1])
    from client_sdk.vllm_connector.plan import ChunkTransfer

    w, caches = worker(timeout=0.5, overlap="whole")
    gated_node.gate.hold_before(1)
    w.start_load([ChunkTransfer("r", tuple(keys), (2, 3))])
    w.wait_for_layer(NAMES[0])  # layer 0 is in, the last layer is not: gives up after 0.5 s
    assert caches[NAMES[0]][[2, 3]].any()
    assert w.stats["failed_loads"] == 1 and w._load.abandoned
    assert w.failed_blocks() == {2, 3}
    gated_node.gate.open()


@pytest.mark.parametrize("shape, why", [
    ((BLOCKS, T, HEADS, 2 * D), "block_size in dim 1 (a [num_blocks, block_size, heads, 2·D] layout)"),
    ((2, BLOCKS, T, HEADS, D), "FlashAttention's [2, num_blocks, block_size, heads, D]"),
    ((BLOCKS, 2, T, HEADS, D), "FlashInfer's [num_blocks, 2, block_size, heads, D]"),
    ((BLOCKS, HEADS, T, 2 * D + 1), "an odd last dimension"),
], ids=["tokens-before-heads", "flash-attention", "flashinfer", "odd-last-dim"])
def test_unknown_kv_layouts_are_refused_at_registration_with_a_message(parts, shape, why):
    """README: layouts other than vLLM's CPU attention one are refused at start-up, never guessed."""
    import torch

    from client_sdk.vllm_connector.worker import WorkerSide

    _, client = parts
    w = WorkerSide(client, T, "auto", 30.0, mode="layerwise")
    # Refused naming what vLLM's CPU backend stores instead (the backend's own layout, client_sdk/vllm_connector/blocks.py).
    with pytest.raises(ValueError, match=r"expected a CPU_ATTN KV layer \[num_blocks, heads, \d+, content\]|CPU_ATTN KV layer's content must be 2·head_dim"):
        w.register({n: torch.zeros(shape, dtype=torch.float32) for n in NAMES}, NAMES)
    assert w.layout is None, why


def test_kv_caches_off_the_cpu_or_not_contiguous_or_of_an_unknown_dtype_are_refused(parts):
    import torch

    from client_sdk.vllm_connector.worker import WorkerSide

    _, client = parts
    cases = {
        "on another device": (torch.zeros(BLOCKS, HEADS, T, 2 * D, device="meta"), "only for KV caches in host memory"),
        "not contiguous": (torch.zeros(BLOCKS, HEADS, 2 * D, T).transpose(2, 3), r"not contiguous|needs dense \[block_size, content\] runs"),
        "float64": (torch.zeros(BLOCKS, HEADS, T, 2 * D, dtype=torch.float64), "has no chunk dtype"),
    }
    for name, (tensor, message) in cases.items():
        w = WorkerSide(client, T, "auto", 30.0, mode="layerwise")
        with pytest.raises(ValueError, match=message):
            w.register({n: tensor for n in NAMES}, NAMES)
        assert w.layout is None, name
