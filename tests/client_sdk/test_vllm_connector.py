"""ObjectCache as vLLM's KV connector, end to end: a real vLLM engine (the tiny model), a real node.

One engine process serves the whole module (starting one costs seconds; the tests send it
generate requests, so "the same process" is that engine's); a fresh process runs a second one.
A reference engine without any connector runs in a third process, started first so it overlaps
the others. vLLM's own prefix cache is off, so every cached token came through ObjectCache.
Greedy decoding: a loaded prefix must give exactly the reference tokens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from kvsupport import rpc
from support import REPO, ServerProcess, boto_client, make_tenants, write_config
from vllm_support import BLOCK, DTYPE, ENV

from client_sdk import chunk_keys
from client_sdk.sync import SyncObjectCacheClient
from client_sdk.vllm_connector.config import ConnectorConfig, namespace

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")

BUCKET = "vllm-kv"
MAX_TOKENS = 12
rng = np.random.default_rng(7)


def _prompt(prefix: list[int], extra: int) -> list[int]:
    return prefix + rng.integers(3, 400, size=extra).tolist()


_PREFIX = rng.integers(3, 400, size=4 * BLOCK).tolist()
PROMPTS = {
    "first": _prompt(_PREFIX, 21),                                   # stores the shared prefix (4 blocks)
    "shared": _prompt(_PREFIX, 30),                                  # same prefix, other suffix: loads 4 blocks
    "tampered": _prompt(rng.integers(3, 400, size=3 * BLOCK).tolist(), 9),
    "failed": _prompt(rng.integers(3, 400, size=16 * BLOCK).tolist(), 5),  # a big load: a wide window to kill it in
}
NAMES = list(PROMPTS)


def _run_engine(spec: dict, tmp_path, stdin=None) -> subprocess.Popen:
    path = tmp_path / f"spec-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "vllm_support.py"), str(path)], stdout=subprocess.PIPE, stdin=stdin,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO, env={**os.environ, **ENV, "PYTHONPATH": str(REPO)})


class Engine:
    """A vLLM engine with the connector in its own process, answering one command at a time."""

    def __init__(self, spec: dict, tmp_path) -> None:
        self.proc = _run_engine(spec, tmp_path, stdin=subprocess.PIPE)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def call(self, timeout: float = 240, **cmd) -> object:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "the engine exited:\n" + "".join(self.output[-60:])
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _result(proc: subprocess.Popen, timeout: float = 240) -> list[dict]:
    out, _ = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, str(REPO / "tests" / "tinymodel.py"), str(path)], check=True, capture_output=True, timeout=240)
    return str(path)


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    """Every prompt's tokens from an engine with no connector at all (a fresh process, started now)."""
    proc = _run_engine({"model": model_dir, "prompts": list(PROMPTS.values()), "max_tokens": MAX_TOKENS}, tmp_path_factory.mktemp("ref"))
    cache: dict[str, list[int]] = {}

    def get(name: str) -> list[int]:
        if not cache:
            cache.update({n: r["tokens"] for n, r in zip(NAMES, _result(proc))})
        return cache[name]

    yield get
    if proc.poll() is None:
        proc.kill()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """Gateway and storage server as separate processes (the failure test kills the storage server).

    Every kv-get is layerwise (``theta_bytes = 0``) and the bandwidth pool paces it to about one
    layer of a 16-chunk load per second (a quarter of that for the other tests' 4-chunk loads), so
    a test can kill the storage server while a load is in flight. No burst credit: with one layer
    of it, the GCRA bucket lets the tiny model's two layers through at once (nothing paced).
    """
    root = tmp_path_factory.mktemp("vllm-node")
    tenant = make_tenants("v")[0]
    layer_bytes = 16 * 2 * BLOCK * 2 * 32 * 4  # 16 chunks × (K,V) × 32 tokens × 2 KV heads × head_dim 32 × fp32
    gbps = layer_bytes * 8 / 1e9
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\ntheta_bytes = 0\n\n[bandwidth]\ncapacity_gbps = {gbps!r}\npolicy = "equal"\nburst_layers = 0\n'))
    storage = ServerProcess(config, command="storage-server").start()
    gateway = ServerProcess(config, command="gateway").start()
    storage.rpc_socket = str(root / "ss.sock")
    boto_client(gateway.endpoint, tenant).create_bucket(Bucket=BUCKET)
    yield storage, gateway, tenant
    gateway.stop()
    if storage.proc.poll() is None:
        storage.stop()


@pytest.fixture(scope="module")
def extra_config(node) -> dict:
    _, gateway, tenant = node
    return {"endpoint": gateway.endpoint, "access_key": tenant.access_key, "secret_key": tenant.secret_key, "bucket": BUCKET, "transport": "auto"}


@pytest.fixture(scope="module")
def llm(model_dir, extra_config, reference, tmp_path_factory):
    engine = Engine({"model": model_dir, "extra_config": extra_config}, tmp_path_factory.mktemp("engine"))
    yield engine
    engine.close()


def generate(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    return engine.call(op="generate", prompts=prompts, max_tokens=max_tokens)  # type: ignore[return-value]


@pytest.fixture(scope="module")
def sdk(extra_config):
    c = SyncObjectCacheClient(extra_config["endpoint"], extra_config["access_key"], extra_config["secret_key"], BUCKET)
    yield c
    c.close()


def keys_of(model_dir: str, prompt: list[int], salt: str | None = None) -> list[str]:
    """The chunk keys the connector gives the prompt's full blocks (rank 0 of 1)."""
    ns = namespace(ConnectorConfig("http://unused", "a", "b"), model_dir, DTYPE, 0, 1, block_size=BLOCK, layout="kv")
    return chunk_keys(prompt, BLOCK, ns, salt)


def wait_stored(sdk, keys: list[str], timeout: float = 30) -> None:
    """Saves are put in the background, after the step that computed them: wait until they are in."""
    deadline = time.monotonic() + timeout
    while sdk.lookup(keys) < len(keys):
        assert time.monotonic() < deadline, f"only {sdk.lookup(keys)} of {len(keys)} chunks were stored"
        time.sleep(0.05)


def worker_stats(engine: Engine) -> dict:
    return engine.call(op="stats")  # type: ignore[return-value]


def test_a_second_generate_loads_the_shared_prefix_and_gives_the_same_tokens(llm, sdk, model_dir, reference):
    first = generate(llm, [PROMPTS["first"]], MAX_TOKENS)[0]
    assert first["cached"] == 0 and first["tokens"] == reference("first")
    keys = keys_of(model_dir, PROMPTS["first"])
    assert len(keys) == 4
    wait_stored(sdk, keys)
    before = worker_stats(llm)
    shared = generate(llm, [PROMPTS["shared"]], MAX_TOKENS)[0]
    assert shared["cached"] == 4 * BLOCK, "the shared prefix was not loaded from ObjectCache"
    assert worker_stats(llm)["loaded_chunks"] - before["loaded_chunks"] == 4
    assert shared["tokens"] == reference("shared")
    # The same prompt again: its own stored prefix (the whole of it but the last partial block).
    again = generate(llm, [PROMPTS["first"]], MAX_TOKENS)[0]
    assert again == {"tokens": reference("first"), "cached": 4 * BLOCK}


def test_random_bytes_in_the_stored_chunks_change_the_output(llm, sdk, node, model_dir, reference):
    """Proof that attention really reads the loaded KV: the same keys with random bytes give other tokens."""
    _, gateway, tenant = node
    prompt = PROMPTS["tampered"]
    assert generate(llm, [prompt], MAX_TOKENS)[0] == {"tokens": reference("tampered"), "cached": 0}
    keys = keys_of(model_dir, prompt)
    wait_stored(sdk, keys)
    # Chunks are immutable: delete them (plain S3), then store random bytes of the same size under the same keys.
    s3 = boto_client(gateway.endpoint, tenant)
    size = s3.head_object(Bucket=BUCKET, Key=keys[0])["ContentLength"]
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys]})
    noise = np.random.default_rng(1).integers(0, 256, size=(len(keys), size), dtype=np.uint8)
    sdk.put_chunks(keys, list(noise))
    tampered = generate(llm, [prompt], MAX_TOKENS)[0]
    assert tampered["cached"] == len(keys) * BLOCK
    assert tampered["tokens"] != reference("tampered"), "the output did not depend on the loaded KV"


def test_a_fresh_process_loads_what_this_one_stored(llm, sdk, model_dir, extra_config, reference, tmp_path):
    # "first" and "shared" share their 4 stored blocks (the first test stored them, unless run alone).
    keys = keys_of(model_dir, PROMPTS["shared"])
    if sdk.lookup(keys) < len(keys):
        generate(llm, [PROMPTS["first"]], MAX_TOKENS)
    wait_stored(sdk, keys)
    proc = _run_engine({"model": model_dir, "prompts": [PROMPTS["shared"], PROMPTS["first"]], "max_tokens": MAX_TOKENS,
                        "extra_config": extra_config}, tmp_path)
    shared, first = _result(proc)
    assert shared == {"tokens": reference("shared"), "cached": 4 * BLOCK}
    assert first == {"tokens": reference("first"), "cached": 4 * BLOCK}


def test_a_load_that_fails_midway_recomputes_and_gives_the_same_tokens(llm, sdk, node, model_dir, reference):
    """The storage server is killed while a load is in flight: vLLM recomputes the blocks, the tokens are right.

    The kill races the load (paced to about a second per layer, in a process busy with vLLM): a kill
    that lands after the last layer leaves nothing to recompute, so the storage server is restarted
    and the load tried again (at most three times).
    """
    storage, _, _ = node
    prompt = PROMPTS["failed"]
    assert generate(llm, [prompt], MAX_TOKENS)[0] == {"tokens": reference("failed"), "cached": 0}
    wait_stored(sdk, keys_of(model_dir, prompt))
    for attempt in range(3):
        if storage.proc.poll() is not None:
            storage.start()
        killed = threading.Event()

        def kill_when_loading() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    active = rpc(storage.rpc_socket, "status")["transfers_active"]
                except OSError:  # the status socket is busy: ask again
                    active = []
                if active:
                    storage.kill()
                    killed.set()
                    return
                time.sleep(0.005)

        killer = threading.Thread(target=kill_when_loading, daemon=True)
        killer.start()
        before = worker_stats(llm)
        out = generate(llm, [prompt], MAX_TOKENS)[0]
        killer.join(5)
        assert killed.is_set(), "no load was seen in flight"
        assert out["tokens"] == reference("failed")
        if worker_stats(llm)["failed_loads"] == before["failed_loads"] + 1:
            break
    else:
        pytest.fail("the storage server was never killed before a load had finished")
    # Everything else keeps working without the storage server: lookups miss, saves are dropped.
    assert generate(llm, [PROMPTS["shared"]], MAX_TOKENS)[0] == {"tokens": reference("shared"), "cached": 0}
