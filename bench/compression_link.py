"""Measured pieces of ``bench compression``: codec throughput per core and a paced link feeding a decode pool.

``codec_figures``: per codec, the compression ratio, encode and decode GB/s on one core (raw bytes per
second) and on a pool of ``workers`` threads, over a dataset's layer slices, decoded as the SDK's pool does
(batches of neighbouring slices, ``Codec.decode_many``); lossless ones checked bit-exact.

``paced_load``: one KV load over a real socket paced by a token bucket (``scheduler.pacing``): the sender
writes each layer's encoded pieces at the link's rate, the receiver hands each piece to a pool of
``workers`` decode threads that write raw bytes into one pre-allocated destination, a piece's slices in one
``Codec.decode_many`` (raw pieces are received straight into it). A layer is ready when its last piece is decoded; the ready times are measured.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from protocol.codecs import BATCH_BYTES, CODEC_NAMES, SliceLayout
from scheduler.pacing import TokenBucket

from .compression_kv import DTYPE, KVSample

_FRAME = struct.Struct("<HHI")  # layer, piece, wire length


@dataclass
class CodecFigures:
    name: str
    lossy: bool
    ratio: float
    encode_gb_s: float
    decode_gb_s_per_core: float
    decode_gb_s_pool: float
    workers: int
    lossless_exact: bool | None  # None for lossy codecs
    max_rel_error: float  # max |decoded − original| / group absmax bound, over the sample (0 for lossless)

    @property
    def decode_per_worker(self) -> float:
        """Bytes/s per worker at the pool's size (what the break-even model is given)."""
        return self.decode_gb_s_pool * 1e9 / self.workers


def _timed(fn, min_s: float) -> float:
    """Seconds per call of ``fn`` (repeated for at least ``min_s``)."""
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / n


def codec_figures(sample: KVSample, names: list[str], workers: int, min_s: float) -> list[CodecFigures]:
    raw_total = sample.slice_bytes * len(sample.slices)
    out = []
    for name in names:
        codec = CODEC_NAMES[name]
        blobs = [codec.encode(s, DTYPE, sample.layout) for s in sample.slices]
        encode_s = _timed(lambda: [codec.encode(s, DTYPE, sample.layout) for s in sample.slices], min_s)

        per = max(1, BATCH_BYTES // sample.slice_bytes)  # slices per call, as the SDK's decode pool batches them
        batches = [range(i, min(i + per, len(blobs))) for i in range(0, len(blobs), per)]
        outs = [np.empty(len(b) * sample.slice_bytes, np.uint8) for b in batches]

        def decode_all(idx: range = range(len(batches))) -> None:
            for i in idx:
                codec.decode_many([blobs[k] for k in batches[i]], outs[i], DTYPE, sample.layout)

        one_core_s = _timed(decode_all, min_s)
        with ThreadPoolExecutor(workers) as pool:
            shards = [range(w, len(batches), workers) for w in range(workers)]
            pool_s = _timed(lambda: list(pool.map(decode_all, shards)), min_s)
        decode_all()
        dests = [out[k * sample.slice_bytes : (k + 1) * sample.slice_bytes] for out, b in zip(outs, batches) for k in range(len(b))]
        exact, rel = None, 0.0
        if codec.lossy:
            rel = max(_rel_error(codec, s, d, sample.layout) for s, d in zip(sample.slices, dests))
        else:
            exact = all(np.array_equal(s, d) for s, d in zip(sample.slices, dests))
        out.append(CodecFigures(name, codec.lossy, raw_total / sum(len(b) for b in blobs), raw_total / encode_s / 1e9,
                                raw_total / one_core_s / 1e9, raw_total / pool_s / 1e9, workers, exact, rel))
    return out


def _rel_error(codec, original: np.ndarray, decoded: np.ndarray, layout: SliceLayout) -> float:
    """The worst group's max |error| over the codec's stated bound for that group (≤ 1 when the bound holds)."""
    from protocol.codecs import group_absmax
    from protocol.codecs.base import to_float32

    a, b = to_float32(original, DTYPE).reshape(layout.planes, layout.tokens, layout.channels), to_float32(decoded, DTYPE)
    err = np.abs(a - b.reshape(a.shape))
    absmax = group_absmax(a, layout)
    worst = 0.0
    keys_err = err[0].max(axis=0)  # per key channel
    groups_err = np.concatenate([keys_err, err[1].max(axis=1)]) if layout.planes == 2 else np.array([err.max()])
    for e, m in zip(groups_err, np.ravel(absmax)):
        bound = codec.max_abs_error(float(m), DTYPE)
        if bound > 0:
            worst = max(worst, float(e) / bound)
    return worst


@dataclass
class Payload:
    """One request's KV as ``layers`` × ``pieces`` encoded pieces (each a run of whole layer slices)."""

    codec: str
    pieces: list[list[bytes]]  # [layer][piece] wire bytes
    piece_raw: int  # raw bytes of one piece
    slices_per_piece: int
    layout: SliceLayout
    order: list[int] = field(default_factory=list)  # the sample slice in each slot, layer-major (what decoding must give back)

    @property
    def raw_bytes(self) -> int:
        return self.piece_raw * sum(len(p) for p in self.pieces)

    @property
    def wire_bytes(self) -> int:
        return sum(len(b) for layer in self.pieces for b in layer)


def build_payload(sample: KVSample, codec_name: str, raw_bytes: int, layers: int, piece_bytes: int) -> Payload:
    """About ``raw_bytes`` of KV over ``layers`` layers, cycling through the sample's slices, each encoded on its own."""
    codec = CODEC_NAMES[codec_name]
    encoded = [codec.encode(s, DTYPE, sample.layout) for s in sample.slices]
    per_piece = max(1, piece_bytes // sample.slice_bytes)
    pieces_per_layer = max(1, round(raw_bytes / layers / (per_piece * sample.slice_bytes)))
    k, pieces, order = 0, [], []
    for _ in range(layers):
        row = []
        for _ in range(pieces_per_layer):
            parts = [encoded[(k + j) % len(encoded)] for j in range(per_piece)]
            order += [(k + j) % len(encoded) for j in range(per_piece)]
            k += per_piece
            row.append(struct.pack(f"<{per_piece}I", *map(len, parts)) + b"".join(parts))
        pieces.append(row)
    return Payload(codec_name, pieces, per_piece * sample.slice_bytes, per_piece, sample.layout, order)


@dataclass
class LoadRun:
    codec: str
    link_gbps: float
    layer_ready_s: list[float] = field(default_factory=list)
    last_byte_s: float = 0.0
    wire_bytes: int = 0
    exact: bool | None = None  # with ``verify``: the destination equals the sample's slices in order

    @property
    def achieved_gbps(self) -> float:
        return self.wire_bytes * 8 / self.last_byte_s / 1e9 if self.last_byte_s else 0.0


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view:
        n = sock.recv_into(view)
        if not n:
            raise ConnectionError("link closed mid-piece")
        view = view[n:]


def _send_paced(sock: socket.socket, payload: Payload, rate: float) -> None:
    bucket = TokenBucket(rate, burst=max(len(b) for layer in payload.pieces for b in layer))
    start = time.perf_counter()
    for layer, row in enumerate(payload.pieces):
        for piece, blob in enumerate(row):
            wait = bucket.reserve(len(blob), time.perf_counter() - start)
            if wait > 0:
                time.sleep(wait)
            sock.sendall(_FRAME.pack(layer, piece, len(blob)))
            sock.sendall(blob)


def paced_load(payload: Payload, link_gbps: float, workers: int, verify: list[np.ndarray] | None = None) -> LoadRun:
    """Load ``payload`` over a socket paced at ``link_gbps``, decoding on ``workers`` threads; ready times measured.

    ``verify``: the sample's raw slices; afterwards (outside the timing) the destination is compared with them.
    """
    codec = CODEC_NAMES[payload.codec]
    layers, per_layer = len(payload.pieces), len(payload.pieces[0])
    dest = np.empty(payload.raw_bytes, np.uint8)
    slice_bytes, n = payload.layout.nbytes(DTYPE), payload.slices_per_piece
    head = struct.Struct(f"<{n}I")
    run = LoadRun(payload.codec, link_gbps, [0.0] * layers, wire_bytes=payload.wire_bytes)
    left = [per_layer] * layers
    lock = threading.Lock()
    all_ready = threading.Event()
    errors: list[BaseException] = []
    start = 0.0

    def piece_done(layer: int) -> None:
        with lock:
            left[layer] -= 1
            if left[layer] == 0:
                run.layer_ready_s[layer] = time.perf_counter() - start
                if not any(left):
                    all_ready.set()

    def decode(layer: int, offset: int, blob: np.ndarray) -> None:
        try:
            parts, pos = [], head.size
            for length in head.unpack_from(blob):
                parts.append(blob[pos:pos + length])
                pos += length
            codec.decode_many(parts, dest[offset:offset + n * slice_bytes], DTYPE, payload.layout)  # one lossy pass a piece
        except BaseException as e:  # reported after the run; the layer never becomes ready
            errors.append(e)
            all_ready.set()
            return
        piece_done(layer)

    a, b = socket.socketpair()
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    pool = ThreadPoolExecutor(workers)
    start = time.perf_counter()
    sender = threading.Thread(target=_send_paced, args=(a, payload, link_gbps * 1e9 / 8), daemon=True)
    sender.start()
    try:
        frame, scratch = bytearray(_FRAME.size), bytearray(head.size)
        for _ in range(layers * per_layer):
            _recv_exact(b, memoryview(frame))
            layer, piece, length = _FRAME.unpack(frame)
            offset = (layer * per_layer + piece) * payload.piece_raw
            if codec.name == "none":  # raw: the bytes land in the destination as they arrive, nothing to decode
                if length != head.size + payload.piece_raw:
                    raise ValueError(f"raw piece is {length} bytes, expected {head.size + payload.piece_raw}")
                _recv_exact(b, memoryview(scratch))
                _recv_exact(b, memoryview(dest[offset:offset + payload.piece_raw]))
                piece_done(layer)
            else:
                blob = np.empty(length, np.uint8)
                _recv_exact(b, memoryview(blob))
                pool.submit(decode, layer, offset, blob)
        run.last_byte_s = time.perf_counter() - start
        all_ready.wait()
    finally:
        pool.shutdown(wait=True)
        sender.join()
        a.close()
        b.close()
    if errors:
        raise errors[0]
    if verify is not None:
        run.exact = all(np.array_equal(dest[i * slice_bytes:(i + 1) * slice_bytes], verify[k]) for i, k in enumerate(payload.order))
    return run
