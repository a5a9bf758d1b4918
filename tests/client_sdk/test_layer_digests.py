"""The client's layer checks over http: each layer's CRC32C is taken as its bytes arrive, and still checked
whole when DATA frames do not arrive in payload order. A LAYER frame whose checksum does not match is BadDigest."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from awscrt.checksums import crc32c

from client_sdk.stream import LayerDigests, LayerStream
from protocol.errors import ErrorCode, S3Error
from protocol.wire import Frame, FrameType

LAYER = 1000
LAYERS = 3


class ScriptedFrames:
    """Frames as a storage server would send them; each DATA payload arrives in parts of ``part`` bytes."""

    def __init__(self, frames: list[tuple[Frame, bytes]], part: int = 77) -> None:
        self.frames, self.part = list(frames), part
        self._data = b""

    async def next_frame(self) -> Frame | None:
        if not self.frames:
            return None
        frame, self._data = self.frames.pop(0)
        return frame

    async def read_into(self, dest: memoryview, n: int, received=None) -> None:
        for pos in range(0, n, self.part):
            k = min(self.part, n - pos)
            dest[pos : pos + k] = self._data[pos : pos + k]
            if received is not None:
                received(dest[pos : pos + k])

    async def read_json(self, frame: Frame) -> dict:
        return {"mode": "layerwise", "payload_bytes": LAYER * LAYERS}


class Response:
    headers: dict[str, str] = {}


def data(offset: int, payload: bytes) -> tuple[Frame, bytes]:
    return Frame(FrameType.DATA, 0, offset, len(payload), 0), payload


def layer(index: int, checksum: int) -> tuple[Frame, bytes]:
    return Frame(FrameType.LAYER, index, index * LAYER, LAYER, checksum), b""


END = (Frame(FrameType.END, 0, 0, 2, 0), b"")


def receive(frames: list[tuple[Frame, bytes]], verify: bool = True, part: int = 77) -> tuple[bytes, list[int]]:
    payload = memoryview(bytearray(LAYER * LAYERS))
    stream = LayerStream(ScriptedFrames(frames, part), Response(), payload, LAYER, LAYERS, "http", verify, 0.0)  # type: ignore[arg-type]

    async def go() -> list[int]:
        return [index async for index, _ in stream]

    order = asyncio.run(go())
    return bytes(payload), order


PAYLOAD = np.random.default_rng(3).integers(0, 256, LAYER * LAYERS, dtype=np.uint8).tobytes()
CRCS = [crc32c(PAYLOAD[i * LAYER : (i + 1) * LAYER]) for i in range(LAYERS)]


def test_layers_in_pieces_are_checked_as_they_arrive():
    frames = []
    for i in range(LAYERS):
        frames += [data(i * LAYER, PAYLOAD[i * LAYER : i * LAYER + 400]), data(i * LAYER + 400, PAYLOAD[i * LAYER + 400 : (i + 1) * LAYER]),
                   layer(i, CRCS[i])]
    assert receive(frames + [END]) == (PAYLOAD, [0, 1, 2])


def test_one_data_frame_across_every_layer_then_the_notifications():
    """Chunkwise: the whole payload in one DATA frame, every LAYER frame after it."""
    frames = [data(0, PAYLOAD)] + [layer(i, CRCS[i]) for i in range(LAYERS)] + [END]
    assert receive(frames, part=333) == (PAYLOAD, [0, 1, 2])


def test_data_frames_out_of_order_are_still_checked_whole():
    frames = [data(500, PAYLOAD[500:LAYER]), data(0, PAYLOAD[:500]), layer(0, CRCS[0]),
              data(LAYER, PAYLOAD[LAYER:]), layer(1, CRCS[1]), layer(2, CRCS[2]), END]
    assert receive(frames) == (PAYLOAD, [0, 1, 2])
    bad = frames[:2] + [layer(0, CRCS[0] ^ 1)]
    with pytest.raises(S3Error) as e:
        receive(bad)
    assert e.value.code == ErrorCode.BadDigest and "layer 0" in e.value.message


def test_a_layer_whose_bytes_do_not_match_its_checksum_is_bad_digest():
    corrupted = PAYLOAD[:LAYER] + bytes([PAYLOAD[LAYER] ^ 0xFF]) + PAYLOAD[LAYER + 1 :]
    frames = [data(0, corrupted[:LAYER]), layer(0, CRCS[0]), data(LAYER, corrupted[LAYER : 2 * LAYER]), layer(1, CRCS[1])]
    with pytest.raises(S3Error) as e:
        receive(frames)
    assert e.value.code == ErrorCode.BadDigest and "layer 1" in e.value.message


def test_without_verify_no_checksum_is_compared():
    frames = [data(0, PAYLOAD)] + [layer(i, 0) for i in range(LAYERS)] + [END]
    assert receive(frames, verify=False) == (PAYLOAD, [0, 1, 2])


def test_digests_split_a_piece_at_layer_boundaries():
    d = LayerDigests(LAYER)
    d.start(0)
    for pos in range(0, len(PAYLOAD), 450):
        d.received(memoryview(PAYLOAD)[pos : pos + 450])
    assert [d.checksum(i, memoryview(b"")) for i in range(LAYERS)] == CRCS
