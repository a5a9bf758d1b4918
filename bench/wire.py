"""``objectcache bench wire``: cost of the descriptor codec per 1,000 keys (Python overhead on every request)."""

from __future__ import annotations

import argparse
import os
import statistics
import time

from protocol.wire import Descriptor, Target, TransportKind, decode_descriptor, encode_descriptor

from .harness import add_bench_parser, finish, grouped_bars, print_table

# A 64K-token prefix at G=16, 64 and 256 for Llama 3.1 8B.
CASES = [(16, 4096), (64, 1024), (256, 256)]


def time_codec(d: Descriptor, repeats: int) -> dict:
    """Median encode and decode time of ``d``, per 1,000 keys, and its size on the wire."""
    body = encode_descriptor(d)
    enc, dec = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        encode_descriptor(d)
        enc.append(time.perf_counter() - t)
        t = time.perf_counter()
        decode_descriptor(body)
        dec.append(time.perf_counter() - t)
    per_k = 1000 / len(d.chunk_keys)
    return {"keys": len(d.chunk_keys), "bytes": len(body),
            "encode_us_per_1k_keys": statistics.median(enc) * 1e6 * per_k,
            "decode_us_per_1k_keys": statistics.median(dec) * 1e6 * per_k}


def shm_descriptor(keys: list[str], num_layers: int, chunk_tokens: int, per_layer_chunk_bytes: int) -> Descriptor:
    """The descriptor an shm fetch of ``keys`` sends (region id and token are random stand-ins)."""
    length = len(keys) * num_layers * per_layer_chunk_bytes
    return Descriptor(keys, num_layers, chunk_tokens, per_layer_chunk_bytes,
                      Target(TransportKind.SHM, os.urandom(16), os.urandom(16), 0, length), (0.03,))


def measure(n_keys: int, chunk_tokens: int, repeats: int) -> dict:
    keys = [f"llama-3.1-8b/{os.urandom(16).hex()}" for _ in range(n_keys)]
    d = shm_descriptor(keys, 32, chunk_tokens, 2 * chunk_tokens * 8 * 128 * 2)
    return {"chunk_tokens": chunk_tokens, **time_codec(d, repeats)}


def run(args: argparse.Namespace) -> dict:
    repeats = 5 if args.quick else 200
    rows = [measure(n, g, repeats) for g, n in CASES]
    print_table(["G", "keys", "descriptor bytes", "encode µs / 1k keys", "decode µs / 1k keys"],
                [[r["chunk_tokens"], r["keys"], r["bytes"], f"{r['encode_us_per_1k_keys']:.0f}", f"{r['decode_us_per_1k_keys']:.0f}"] for r in rows])
    result = {"benchmark": "wire", "quick": args.quick, "rows": rows}
    return finish(args, result, plot)


def plot(result: dict, fig) -> None:
    rows = result["rows"]
    ax = fig.subplots()
    grouped_bars(ax, [f"G={r['chunk_tokens']} ({r['keys']} keys)" for r in rows],
                 {"encode": [r["encode_us_per_1k_keys"] for r in rows], "decode": [r["decode_us_per_1k_keys"] for r in rows]}, rotation=0)
    ax.set_ylabel("µs per 1,000 keys")
    ax.set_title("bench wire: descriptor codec cost")
    ax.legend()


def add_parser(sub) -> None:
    add_bench_parser(sub, "wire", "descriptor encode/decode cost per 1,000 keys", run)
