"""vLLM (CPU, the tiny model) with int8 chunks: the node stores the connector's KV as int8 (a lossy bucket's
configured codec), the same prompt run again loads its prefix dequantised, and greedy decoding gives the tokens
of the first run, which computed everything (no prefix in the bucket yet). One engine serves both runs (vLLM's
own prefix cache is off, so the second run's prefix comes only from ObjectCache). The logit error (chosen
tokens' logprobs against the first run) is printed and bounded loosely.
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
from support import REPO, ServerProcess, boto_client, make_tenants, write_config
from vllm_support import BLOCK, DTYPE, ENV

from client_sdk import chunk_keys
from client_sdk.sync import SyncObjectCacheClient
from client_sdk.vllm_connector.config import ConnectorConfig, namespace
from protocol.codecs import codec_by_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'objectcache[vllm]'; make test does)")

BUCKET = "vllm-int8"
MAX_TOKENS = 12
rng = np.random.default_rng(27)
PROMPT = rng.integers(3, 400, size=4 * BLOCK + 23).tolist()  # 4 whole blocks: stored by the first run, loaded by the second


class Engine:
    """tests/vllm_logprobs.py in its own process, one command at a time."""

    def __init__(self, spec: dict, tmp_path) -> None:
        path = tmp_path / f"spec-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(spec))
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "vllm_logprobs.py"), str(path)], stdout=subprocess.PIPE,
                                     stdin=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                     env={**os.environ, **ENV, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"})
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def generate(self, prompt: list[int], timeout: float = 600) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompts": [prompt], "max_tokens": MAX_TOKENS}) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no result in {timeout:.0f} s; the engine said:\n" + "".join(self.output[-60:])) from None
            assert line is not None, "the engine exited:\n" + "".join(self.output[-60:])
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])[0]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, str(REPO / "tests" / "tinymodel.py"), str(path)], check=True, capture_output=True, timeout=240)
    return str(path)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-int8")
    tenant = make_tenants("v")[0]
    config = write_config(root / "c.toml", root / "data", [tenant], extra=(
        f'\n[storage_server]\nsocket = "{root / "ss.sock"}"\n'
        f'[compression]\nlossy_buckets = ["{BUCKET}"]\nbucket_codecs = ["{BUCKET}:int8"]\n'))
    proc = ServerProcess(config).start()
    boto_client(proc.endpoint, tenant).create_bucket(Bucket=BUCKET)
    yield proc, tenant
    proc.stop()


@pytest.mark.timeout(900)  # building the model and starting one CPU engine: minutes on a loaded 2-core machine
def test_int8_chunks_give_the_reference_greedy_tokens(node, model_dir, tmp_path):
    proc, tenant = node
    engine = Engine({"model": model_dir, "extra_config": {"endpoint": proc.endpoint, "access_key": tenant.access_key,
                                                          "secret_key": tenant.secret_key, "bucket": BUCKET, "transport": "auto"}}, tmp_path)
    sdk = SyncObjectCacheClient(proc.endpoint, tenant.access_key, tenant.secret_key, BUCKET)
    try:
        want = engine.generate(PROMPT)  # the reference: nothing stored yet, every token computed
        assert want["cached"] == 0
        ns = namespace(ConnectorConfig("http://unused", "a", "b"), model_dir, DTYPE, 0, 1, block_size=BLOCK, layout="kv")
        keys = chunk_keys(PROMPT, BLOCK, ns, None)
        assert len(keys) == 4
        deadline = time.monotonic() + 60
        while sdk.lookup(keys) < len(keys):  # saves are put in the background, after the step that computed them
            assert time.monotonic() < deadline, "the prefix was not stored"
            time.sleep(0.05)
        s3 = boto_client(proc.endpoint, tenant)
        stored = s3.get_object(Bucket=BUCKET, Key=keys[0])["Body"].read()
        assert stored[:8] == b"\xff\xff\xff\xffOCKZ" and stored[9] == codec_by_name("int8").id  # stored as int8 by the node

        got = engine.generate(PROMPT)
        assert got["cached"] == 4 * BLOCK, "the prefix was not loaded from ObjectCache"
        assert got["tokens"] == want["tokens"]
        errors = [abs(s[str(t)] - r[str(t)]) for t, s, r in zip(want["tokens"], got["logprobs"], want["logprobs"])]
        print(f"\nint8 KV: max |logprob error| of the chosen tokens {max(errors):.5f}, mean {sum(errors) / len(errors):.5f} "
              f"over {len(errors)} steps")
        assert max(errors) < 0.5
    finally:
        sdk.close()
        engine.close()
