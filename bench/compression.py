"""``objectcache bench compression``: when compressed KV pays, side by side with raw (issue 27).

1. **Codecs**: compression ratio, encode and decode GB/s per core (and on the decode pool) of every codec in
   ``protocol.codecs`` on real KV from the test model (``--full``; :mod:`bench.compression_kv`) and on
   synthetic bf16 KV (labelled as such); lossless ones checked bit-exact, lossy ones against their bound.
2. **TTFT vs link rate**: one request's KV (``--payload-mb``, 32 layers) over a real socket paced at each
   rate (~1–40 Gbps), decoded on ``--workers`` threads into one destination; layer-ready times measured,
   then the uncached suffix's prefill compute laid over them layer by layer (compute modelled: Llama 3.1 8B
   on an A100 at 16K context, 87.5% cached, scaled with the payload so the ratios hold). Raw, every codec,
   and the adaptive choice (``scheduler.choose_codec`` fed the measured ratios and pool decode rates, each the slower
   of the pool's alone and what it reached beside the link: ``beside_the_link``).
   This is a model-backed measurement of the node's data path, not a kv-get through a node: the paced
   link and the decode pool are real, the engine's compute is modelled.
2b. **TTFT through a node** (:mod:`bench.compression_node`): per link rate a node whose bandwidth pool paces every
   kv-get to it; raw chunks vs the same KV stored with one codec, decoded in the node, in the SDK, or where
   ``decode="auto"`` — the kv-get path's own choice — puts it, on nodes without decoded copies (every kv-get the node
   serves decodes); then at the slowest and fastest rate a node with the default configuration (decoded copies on): a
   kv-get of chunks never read before and a warm one. The headline fields come from the latter's ``auto``.
3. **Interference**: a compute loop's slowdown while decoding runs in the engine's process vs in another
   process (the node) — ShadowServe's point, on CPU (:mod:`bench.compression_interference`).
4. **Cold capacity tier**: a cold kv-get through a node over SeaweedFS with compressed vs raw chunk objects
   (the upstream link carries the compressed bytes, the node decodes; :mod:`bench.compression_capacity`).
"""

from __future__ import annotations

import argparse
import os
import statistics

from protocol.codecs import CODEC_NAMES
from scheduler.codec_choice import RAW, CodecProfile, CodecRequest, choose_codec, modelled_stall

from . import compression_capacity, compression_interference, compression_node
from .compression_kv import KVSample, real_kv, real_kv_available, synthetic_kv
from .compression_link import CodecFigures, build_payload, codec_figures, paced_load
from .compute_model import modelled_ttft, prefill_seconds
from .harness import add_bench_parser, finish, grouped_bars, print_table, print_targets

# Compute per KV byte of the TTFT model: Llama 3.1 8B, 16K context with 14336 tokens cached (131072 B/token).
CONTEXT, CACHED, BYTES_PER_TOKEN = 16384, 14336, 131072
COMPUTE_S_PER_KV_BYTE = prefill_seconds(CONTEXT, CACHED) / (CACHED * BYTES_PER_TOKEN)
SHADOWSERVE_ANCHOR = (1.2, 1.4)  # its TTFT gain at ≤ 20 Gbps
GOAL_SLOW_SPEEDUP = 1.5


def _figures_row(sample: KVSample, f: CodecFigures) -> dict:
    return {"kv": sample.name, "codec": f.name, "lossy": f.lossy, "ratio": round(f.ratio, 4),
            "encode_gb_s": round(f.encode_gb_s, 4), "decode_gb_s_per_core": round(f.decode_gb_s_per_core, 4),
            "decode_gb_s_pool": round(f.decode_gb_s_pool, 4), "workers": f.workers,
            "lossless_exact": f.lossless_exact, "error_over_bound": round(f.max_rel_error, 4)}


def sweep(sample: KVSample, codecs: list[str], rates: list[float], args, compute_per_layer: float) -> dict[str, dict[float, dict]]:
    """codec → rate → {ttft_s, load_s, achieved_gbps, wire_bytes, raw_bytes} (median TTFT over ``args.reps``).

    Runs interleave (repeat → rate → codec), so a shared machine's load drifts over every codec alike.
    """
    payloads = {name: build_payload(sample, name, args.payload_mb << 20, args.layers, args.piece_kb << 10) for name in codecs}
    runs: dict[tuple[str, float], list] = {(c, r): [] for c in codecs for r in rates}
    for rep in range(args.reps):
        for rate in rates:
            for name in codecs:  # the first run of each lossless codec is checked byte-exact after its timing
                check = sample.slices if rep == 0 and rate == rates[0] and not CODEC_NAMES[name].lossy else None
                runs[name, rate].append(paced_load(payloads[name], rate, args.workers, verify=check))
    out: dict[str, dict[float, dict]] = {}
    for name in codecs:
        out[name] = {}
        for rate in rates:
            ttfts = [modelled_ttft(r.layer_ready_s, compute_per_layer) for r in runs[name, rate]]
            mid = runs[name, rate][ttfts.index(statistics.median_low(ttfts))]
            out[name][rate] = {"ttft_s": statistics.median_low(ttfts), "runs_ttft_s": [round(t, 5) for t in ttfts],
                               "load_s": max(mid.layer_ready_s), "achieved_gbps": round(mid.achieved_gbps, 3),
                               "wire_bytes": payloads[name].wire_bytes, "raw_bytes": payloads[name].raw_bytes}
        out[name][rates[0]]["byte_exact"] = runs[name, rates[0]][0].exact
    return out


def beside_the_link(profiles: list[CodecProfile], measured: dict[str, dict[float, dict]], fastest: float, workers: int) -> list[CodecProfile]:
    """The decode rates the chooser is given: the slower of the pool's alone (the codec table) and what the pool
    reached beside the link at the fastest rate, where the decoders bound the load (raw bytes over the last layer's
    ready time: a lower bound). The SDK's decode meter, which the node's chooser is told, is measured the same way,
    in operation. Alone, int8 decoded 1.53 GB/s on 2 workers; beside the link's sender and receiver threads the
    pool reached ~1 GB/s, and the chooser fed the former sent int8 at 10 Gbps, 0.81x raw."""
    out = []
    for p in profiles:
        run = measured.get(p.name, {}).get(fastest)
        reached = run["raw_bytes"] / run["load_s"] / workers if run and run["load_s"] > 0 else p.decode_bytes_per_s_per_core
        out.append(CodecProfile(p.name, p.ratio, min(p.decode_bytes_per_s_per_core, reached), p.lossy))
    return out


def run(args: argparse.Namespace) -> dict:
    _defaults(args)
    codecs = args.codecs or list(CODEC_NAMES)
    samples = [synthetic_kv(args.synthetic_slices, args.chunk_tokens)]
    real_ok, why_not = real_kv_available()
    if args.kv == "real" and not real_ok:
        raise SystemExit(f"--kv real: {why_not}")
    if args.kv == "real" or (args.kv == "auto" and real_ok and not args.quick):
        samples.insert(0, real_kv(args.real_tokens, args.chunk_tokens))
    elif args.kv == "auto":
        why_not = why_not or "--quick runs synthetic KV only (building the test model takes ~20 s)"
    primary = samples[0]
    if args.only == "node":
        return _node_only(args, primary)

    print("\n## Codecs: compression ratio and decode throughput")
    figures: dict[str, list[CodecFigures]] = {}
    table, rows = [], []
    for s in samples:
        print(f"- {s.name}: {s.label}")
        figures[s.name] = codec_figures(s, codecs, args.workers, args.min_s)
        for f in figures[s.name]:
            rows.append(_figures_row(s, f))
            check = "bit-exact" if f.lossless_exact else ("NOT EXACT" if f.lossless_exact is False else f"{f.max_rel_error:.2f} of bound")
            table.append([s.name, f.name, f"{f.ratio:.2f}×", f"{f.encode_gb_s:.2f}", f"{f.decode_gb_s_per_core:.2f}",
                          f"{f.decode_gb_s_pool:.2f}", check])
    print_table(["KV", "codec", "ratio", "encode GB/s/core", "decode GB/s/core", f"decode GB/s on {args.workers} workers", "exact / error"], table)

    compute_per_layer = args.payload_mb * (1 << 20) * COMPUTE_S_PER_KV_BYTE / args.layers
    profiles = [CodecProfile(f.name, f.ratio, f.decode_per_worker, f.lossy) for f in figures[primary.name] if f.name != RAW]
    print(f"\n## TTFT vs link rate ({primary.name} KV, {args.payload_mb} MiB over {args.layers} layers, {args.workers} decode workers, "
          f"compute {compute_per_layer * 1e3:.2f} ms/layer)")
    measured = sweep(primary, sorted(set(codecs) | {RAW}, key=list(CODEC_NAMES).index), args.rates, args, compute_per_layer)
    profiles = beside_the_link(profiles, measured, max(args.rates), args.workers)
    sweep_rows, table = [], []
    for rate in args.rates:
        raw = measured[RAW][rate]["ttft_s"]
        payload = measured[RAW][rate]["raw_bytes"]
        picks = {}
        for label, lossy in (("adaptive", True), ("adaptive-lossless", False)):
            req = CodecRequest(rate * 1e9 / 8, payload, args.layers, args.workers, allow_lossy=lossy, compute_per_layer_s=compute_per_layer)
            picks[label] = choose_codec(req, profiles).codec
        best = min(measured, key=lambda c: measured[c][rate]["ttft_s"])
        req = CodecRequest(rate * 1e9 / 8, payload, args.layers, args.workers, allow_lossy=True, compute_per_layer_s=compute_per_layer)
        row = {"link_gbps": rate, "raw_ttft_s": round(raw, 6), "best_fixed": best,
               "codecs": {c: {**{k: (round(v, 6) if isinstance(v, float) else v) for k, v in measured[c][rate].items()},
                              "speedup_vs_raw": round(raw / measured[c][rate]["ttft_s"], 4),
                              "model_ttft_s": round(_model_ttft(c, profiles, req, compute_per_layer), 6)} for c in measured}}
        for label, codec in picks.items():
            t = measured[codec][rate]["ttft_s"]
            row[label] = {"codec": codec, "ttft_s": round(t, 6), "speedup_vs_raw": round(raw / t, 4),
                          "vs_best_fixed": round(t / measured[best][rate]["ttft_s"], 4)}
        sweep_rows.append(row)
        table.append([f"{rate:g}", f"{measured[RAW][rate]['achieved_gbps']:.2f}", f"{raw * 1e3:.1f}", *(f"{raw / measured[c][rate]['ttft_s']:.2f}×" for c in measured if c != RAW),
                      f"{picks['adaptive']} {row['adaptive']['speedup_vs_raw']:.2f}×",
                      f"{picks['adaptive-lossless']} {row['adaptive-lossless']['speedup_vs_raw']:.2f}×", best])
    print_table(["link Gbps", "raw reached Gbps", "raw TTFT ms", *(f"{c} vs raw" for c in measured if c != RAW), "adaptive (lossy allowed)", "adaptive (lossless only)",
                 "best fixed"], table)

    interf_codec = sweep_rows[0]["adaptive"]["codec"]
    interf_codec = interf_codec if interf_codec != RAW else "zstd"
    node = _through_a_node(args, primary, interf_codec)
    blobs = [CODEC_NAMES[interf_codec].encode(s, "bfloat16", primary.layout) for s in primary.slices]
    inter_rows = []
    for pinned in ((True,) if args.quick else (True, False)):
        split = compression_interference.core_split() if pinned else None
        where = f"engine on cores {sorted(split[0])}, node on {sorted(split[1])}" if split else "unpinned: both on every core"
        print(f"\n## Interference: a compute loop while {args.workers} threads decode {interf_codec} ({args.interference_s:g} s each; {where}; "
              f"{len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.1f}: with few or busy cores the node's process competes too)")
        runs = compression_interference.measure(interf_codec, blobs, primary.slice_bytes, primary.layout, args.workers, args.interference_s,
                                                pinned)
        alone = runs[0].compute_iters_per_s
        rows_now = [{"mode": r.mode, "pinned": r.pinned, "cores": where, "compute_iters_per_s": round(r.compute_iters_per_s, 2),
                     "compute_slowdown": round(1 - r.compute_iters_per_s / alone, 4), "decode_gb_s": round(r.decode_gb_s, 4)} for r in runs]
        inter_rows += rows_now
        print_table(["decode runs", "compute iterations/s", "compute slowdown", "decode GB/s"],
                    [[r["mode"], f"{r['compute_iters_per_s']:.0f}", f"{r['compute_slowdown']:.0%}", f"{r['decode_gb_s']:.2f}"] for r in rows_now])

    capacity = {"measured": False, "reason": "--no-capacity"}
    if not args.no_capacity:
        cap_codecs = [c for c in (["none", "zstd", "int4+zstd"] if args.quick else ["none", "zstd", "int8+zstd", "int4+zstd", "fp8+zstd"])
                      if c in codecs or c == RAW]
        print(f"\n## Cold capacity-tier kv-get from SeaweedFS ({args.capacity_chunks} chunks × {args.layers} layers, {primary.name} KV)")
        capacity = compression_capacity.measure(primary, cap_codecs, args.layers, args.capacity_chunks, args.reps)
        if capacity["measured"]:
            print_table(["codec", "cold kv-get ms", "upstream MB", "delivered GB/s", "vs raw", "byte-exact"],
                        [[r["codec"], f"{r['cold_ms']:.1f}", f"{r['upstream_bytes'] / 1e6:.1f}", f"{r['delivered_gb_s']:.3f}",
                          f"{r['speedup_vs_raw']:.2f}×", "-" if r["byte_exact"] is None else r["byte_exact"]] for r in capacity["rows"]])
        else:
            print(f"not measured: {capacity['reason']}")

    slow, fast = sweep_rows[0], sweep_rows[-1]
    result = {
        "bench": "compression", "quick": bool(args.quick), "workers": args.workers, "layers": args.layers,
        "kv": [{"name": s.name, "label": s.label, "slices": len(s.slices), "slice_bytes": s.slice_bytes} for s in samples],
        "real_kv": primary.name == "tiny-model", "real_kv_note": "" if primary.name == "tiny-model" else why_not,
        "codecs": rows,
        "sweep": {"kv": primary.name, "payload_bytes": slow["codecs"][RAW]["raw_bytes"], "compute_per_layer_s": compute_per_layer,
                  "method": "measured: paced socket + decode pool, layer-ready times; modelled: the engine's prefill compute laid over them",
                  "rows": sweep_rows,
                  # what the adaptive column's chooser was told (beside_the_link): decode GB/s per worker, by codec
                  "chooser_decode_gb_s_per_worker": {p.name: round(p.decode_bytes_per_s_per_core / 1e9, 4) for p in profiles}},
        **_headlines(node),
        "model_sweep_speedup_slowest_link": slow["adaptive"]["speedup_vs_raw"],
        "model_sweep_ratio_fastest_link": round(fast["adaptive"]["ttft_s"] / fast["raw_ttft_s"], 4),
        "model_sweep_speedup_slowest_link_lossless": slow["adaptive-lossless"]["speedup_vs_raw"],
        "model_sweep_ratio_fastest_link_lossless": round(fast["adaptive-lossless"]["ttft_s"] / fast["raw_ttft_s"], 4),
        "fields": {**HEADLINE_FIELDS,
                   "model_sweep_*": "the same ratios in the node-less sweep, where the adaptive column is scheduler.choose_codec's pick"},
        "node": node,
        "interference": {"codec": interf_codec, "seconds": args.interference_s, "rows": inter_rows, "cores": len(os.sched_getaffinity(0)),
                         "load_1min": round(os.getloadavg()[0], 2),
                         "caveat": "ShadowServe's decode runs on a SmartNIC's own cores; here the node's process shares this machine's "
                                   "cores (pinned to half of them, or unpinned) and any other load on it, so with few or busy cores "
                                   "a separate process competes for CPU about as much as threads in the engine's process do"},
        "capacity_cold": capacity,
    }
    result["targets"] = targets(result)
    print_targets(result["targets"])
    return finish(args, result, plot)


def _through_a_node(args: argparse.Namespace, primary: KVSample, codec: str) -> dict:
    # 0.25 Gbps: below what a loaded 2-core VM's http path reaches unpaced (the link, not the CPU, binds there).
    node_rates = args.node_rates or ([0.25, args.rates[-1]] if args.quick else [0.25, args.rates[0], 5.0, args.rates[-1]])
    print(f"\n## TTFT through a node ({codec} stored, {args.node_payload_mb} MiB, http, pool paced at each rate; "
          f"auto = the kv-get path's decode=\"auto\"; decoded copies off: every kv-get the node serves decodes)")
    node = compression_node.measure(primary, codec, node_rates, args.layers, args.node_payload_mb, args.reps, args.workers,
                                    args.node_payload_mb * (1 << 20) * COMPUTE_S_PER_KV_BYTE / args.layers)
    print_table(["link Gbps", "raw TTFT ms", "node decodes", "client decodes", "auto", "auto's site", "auto's wire MB"],
                [[f"{r['link_gbps']:g}", f"{r['variants']['raw']['ttft_s'] * 1e3:.1f}", f"{r['node_vs_raw']:.2f}×", f"{r['client_vs_raw']:.2f}×",
                  f"{r['auto_vs_raw']:.2f}×", "/".join(r["variants"]["auto"]["sites"]), f"{r['variants']['auto']['wire_bytes'] / 1e6:.1f}"]
                 for r in node["rows"]])
    _print_default(node)
    return node


def _node_only(args: argparse.Namespace, primary: KVSample) -> dict:
    """``--only node``: the through-a-node rows and the headline fields alone (codec: ``--node-codec``)."""
    node = _through_a_node(args, primary, args.node_codec)
    result = {"bench": "compression", "only": "node", "quick": bool(args.quick), "workers": args.workers, "layers": args.layers,
              "kv": [{"name": primary.name, "label": primary.label}], "load_1min": round(os.getloadavg()[0], 2),
              **_headlines(node), "fields": HEADLINE_FIELDS, "node": node}
    result["targets"] = {"decode=auto through a node (default configuration, warm) never slower than raw at the fastest link":
                         result["ttft_ratio_fastest_link"] <= 1.0}
    print(f"\nload average (1 min) {result['load_1min']}")
    print_targets(result["targets"])
    return finish(args, result)


def _print_default(node: dict) -> None:
    print(f"\nthe same with the default configuration (decoded copies on, {node['default_config'][0]['decoded_copies_bytes']} bytes; the "
          "headline fields): first = a kv-get of chunks never read before (after their kv-put landed), put→get = one the moment "
          "its kv-put returns, auto = a warm one")
    print_table(["link Gbps", "raw TTFT ms", "first kv-get", "first's copies", "put→get", "put→get's copies", "warm auto", "warm auto's site",
                 "copies read"],
                [[f"{r['link_gbps']:g}", f"{r['variants']['raw']['ttft_s'] * 1e3:.1f}", f"{r['first_vs_raw']:.2f}×",
                  str(r["variants"]["first"]["decoded_copies"]), f"{r['put_then_get_vs_raw']:.2f}×",
                  "/".join(str(x) for x in r["variants"]["put_then_get"]["runs_copies"]), f"{r['auto_vs_raw']:.2f}×",
                  r["variants"]["auto"]["site"], f"{r['variants']['auto']['decoded_copies']} {r['variants']['auto']['decoded_copies_read']}"]
                 for r in node["default_config"]])


def _headlines(node: dict) -> dict:
    """The top-level TTFT fields: decode="auto" through a node with the default configuration, and beside them the
    same kv-get's first time and a node without decoded copies."""
    slow, fast = node["default_config"][0], node["default_config"][-1]
    return {
        "ttft_speedup_slowest_link": slow["auto_vs_raw"],
        "ttft_ratio_fastest_link": round(1 / fast["auto_vs_raw"], 4),
        "ttft_ratio_fastest_link_first_get": round(1 / fast["first_vs_raw"], 4),
        "ttft_ratio_fastest_link_put_then_get": round(1 / fast["put_then_get_vs_raw"], 4),
        "ttft_ratio_fastest_link_no_copies": round(1 / node["rows"][-1]["auto_vs_raw"], 4),
        "ttft_speedup_slowest_link_no_copies": node["rows"][0]["auto_vs_raw"],
    }


HEADLINE_FIELDS = {
    "ttft_speedup_slowest_link": "through a node with the default configuration at the slowest link: raw chunks' TTFT / a warm "
                                 "decode=\"auto\" kv-get's TTFT (stored codec: node.codec)",
    "ttft_ratio_fastest_link": "the same at the fastest link, inverted: warm decode=\"auto\" TTFT / raw TTFT (≤ 1: never worse than raw); "
                               "warm: the chunks were read once before, so the node serves its decoded copies (on by default)",
    "ttft_ratio_fastest_link_first_get": "the same for a kv-get of chunks never read before, after their kv-put landed (the node "
                                         "copied them right after the put: compression.decode_on_put, on by default)",
    "ttft_ratio_fastest_link_put_then_get": "the same for a kv-get issued the moment its kv-put returns (racing those copies: what is "
                                            "not copied yet is decoded by the node or the SDK)",
    "ttft_ratio_fastest_link_no_copies": "the same on a node with compression.decoded_copies_bytes = 0 (every kv-get the node serves decodes)",
    "ttft_speedup_slowest_link_no_copies": "the slowest link's on that node",
}


def _model_ttft(codec: str, profiles: list[CodecProfile], req: CodecRequest, compute_per_layer: float) -> float:
    """The break-even model's TTFT for ``codec`` (stall + the engine's own compute), beside the measurement."""
    p = next((p for p in profiles if p.name == codec), CodecProfile(RAW, 1.0, float("inf")))
    return modelled_stall(p, req) + req.num_layers * compute_per_layer


def targets(result: dict) -> dict[str, bool]:
    rows = result["sweep"]["rows"]
    low = [r for r in rows if r["link_gbps"] <= 20]
    node = result["node"]["rows"]
    return {
        f"decode=auto through a node ≥ {GOAL_SLOW_SPEEDUP}× faster than raw at the slowest link": result["ttft_speedup_slowest_link"] >= GOAL_SLOW_SPEEDUP,
        "decode=auto through a node (default configuration, warm) never slower than raw at the fastest link": result["ttft_ratio_fastest_link"] <= 1.0,
        "decode=auto through a node no slower than the better of node / client decode at every rate":
            all(r["auto_vs_raw"] >= 0.95 * max(r["node_vs_raw"], r["client_vs_raw"]) for r in node),
        f"model sweep: adaptive ≥ {GOAL_SLOW_SPEEDUP}× faster than raw at the slowest link": result["model_sweep_speedup_slowest_link"] >= GOAL_SLOW_SPEEDUP,
        "model sweep: adaptive never slower than raw at the fastest link": result["model_sweep_ratio_fastest_link"] <= 1.0,
        f"model sweep: adaptive at or above ShadowServe's {SHADOWSERVE_ANCHOR[0]}× on every link ≤ 20 Gbps":
            bool(low) and all(r["adaptive"]["speedup_vs_raw"] >= SHADOWSERVE_ANCHOR[0] for r in low),
        "decoding in the node (own cores) slows compute less than in the engine's process":
            result["interference"]["rows"][2]["compute_slowdown"] < result["interference"]["rows"][1]["compute_slowdown"],
        "lossless codecs bit-exact": all(r["lossless_exact"] for r in result["codecs"] if not r["lossy"]),
        "lossless loads over the paced link byte-exact": all(c["byte_exact"] for name, c in rows[0]["codecs"].items() if not CODEC_NAMES[name].lossy),
        **({"cold capacity-tier kv-get: lossless compressed chunks no slower than raw":
            next(r["speedup_vs_raw"] for r in result["capacity_cold"]["rows"] if r["codec"] == "zstd") >= 1.0}
           if result["capacity_cold"]["measured"] and any(r["codec"] == "zstd" for r in result["capacity_cold"]["rows"]) else {}),
    }


def plot(result: dict, fig) -> None:
    rows = result["sweep"]["rows"]
    rates = [r["link_gbps"] for r in rows]
    ax = fig.add_subplot(1, 3, 1)
    for codec in rows[0]["codecs"]:
        ax.plot(rates, [r["codecs"][codec]["ttft_s"] * 1e3 for r in rows], marker=".", label=codec, alpha=0.7)
    ax.plot(rates, [r["adaptive"]["ttft_s"] * 1e3 for r in rows], "k--", lw=2, label="adaptive (model sweep)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link Gbps")
    ax.set_ylabel("TTFT ms")
    ax.set_title(f"TTFT vs link ({result['sweep']['kv']} KV)", fontsize=9)
    ax.legend(fontsize=6)
    ax = fig.add_subplot(1, 3, 2)
    mine = [r for r in result["codecs"] if r["kv"] == result["sweep"]["kv"] and r["codec"] != RAW]  # raw's decode is a copy
    grouped_bars(ax, [r["codec"] for r in mine], {"ratio": [r["ratio"] for r in mine],
                                                   "decode GB/s/core": [r["decode_gb_s_per_core"] for r in mine]})
    ax.set_title("ratio and decode GB/s per core", fontsize=9)
    ax.legend(fontsize=7)
    ax = fig.add_subplot(1, 3, 3)
    inter = result["interference"]["rows"][:3]
    ax.bar([r["mode"].replace("decode in ", "") for r in inter], [r["compute_iters_per_s"] for r in inter])
    ax.set_ylabel("compute iterations/s")
    ax.set_title(f"interference ({result['interference']['codec']})", fontsize=9)


def _defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    args.rates = args.rates or ([1.0, 10.0, 40.0] if quick else [1.0, 2.5, 5.0, 10.0, 20.0, 40.0])
    args.payload_mb = args.payload_mb or (4 if quick else 64)
    args.workers = args.workers or (2 if quick else 4)
    args.reps = args.reps or (1 if quick else 3)
    args.interference_s = args.interference_s or (0.5 if quick else 3.0)
    args.min_s = 0.02 if quick else 0.3
    args.synthetic_slices = 4 if quick else 16
    args.capacity_chunks = args.capacity_chunks or (2 if quick else 16)
    args.node_payload_mb = args.node_payload_mb or (2 if quick else 16)
    if args.chunk_tokens is None:
        args.chunk_tokens = 64 if quick else 256


def add_parser(sub) -> None:
    p = add_bench_parser(sub, "compression", "codecs' ratio and decode GB/s, TTFT vs paced link rate (raw, codecs, adaptive), interference", run)
    p.add_argument("--kv", choices=["auto", "real", "synthetic"], default="auto",
                   help="KV to measure: real (the test model's, needs torch+transformers), synthetic, or auto (real unless --quick)")
    p.add_argument("--codecs", nargs="+", choices=list(CODEC_NAMES), help="codecs (default: all registered)")
    p.add_argument("--rates", type=float, nargs="+", help="link rates in Gbps (default 1 2.5 5 10 20 40)")
    p.add_argument("--payload-mb", type=int, help="one request's raw KV in MiB (default 64; --quick 4)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--piece-kb", type=int, default=512, help="raw KiB per piece on the link (whole layer slices)")
    p.add_argument("--workers", type=int, help="decode threads (default 4; --quick 2)")
    p.add_argument("--reps", type=int, help="runs per (codec, rate); the median TTFT is reported (default 3)")
    p.add_argument("--chunk-tokens", type=int, help="G: tokens per layer slice (default 256; --quick 64)")
    p.add_argument("--real-tokens", type=int, default=4096, help="tokens the test model runs over for real KV")
    p.add_argument("--capacity-chunks", type=int, help="chunks per cold capacity-tier kv-get (default 16; --quick 2)")
    p.add_argument("--no-capacity", action="store_true", help="skip the cold capacity-tier kv-gets (they start SeaweedFS and two nodes)")
    p.add_argument("--node-rates", type=float, nargs="+", help="link rates (Gbps) of the through-a-node runs (default: 0.25, the sweep's slowest, 5, its fastest)")
    p.add_argument("--node-payload-mb", type=int, help="one kv-get's raw KV through a node in MiB (default 16; --quick 2)")
    p.add_argument("--interference-s", type=float, help="seconds per interference run (default 3)")
    p.add_argument("--only", choices=["node"], help="node: only the TTFT-through-a-node rows and the headline fields (skips codecs, "
                                                      "the model sweep, interference and the capacity tier)")
    p.add_argument("--node-codec", default="zstd", choices=[c for c in CODEC_NAMES if c != RAW],
                   help="the stored codec of --only node (the full run uses the model sweep's pick at the slowest link)")
