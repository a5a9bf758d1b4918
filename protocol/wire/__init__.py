"""The ObjectCache wire contract — the one definition imported by gateway, storage_server and client_sdk.

Everything that crosses a process boundary on the KV path is defined here:

* **Descriptor** (body of ``POST /{bucket}?kv-get``): which chunk objects, the
  model layout, where the payload goes, the compute window and the mode.
* **Key list** (body of ``?kv-lookup``) and **put batch** (body of ``?kv-put``).
* **Frames** streamed back (HTTP response body, and the storage-server RPC):
  ``DATA`` (payload bytes, ``http`` transport), ``LAYER`` (layer ℓ is complete
  in the destination, with its CRC32C), ``END`` (statistics) and ``ERROR``.

All integers are little-endian. Keys travel as a shared prefix plus
newline-separated suffixes, so encoding and decoding thousands of keys is a
handful of C-level calls. Decoding is strict: any malformed input raises an
:class:`S3Error` naming the field, never another exception.

Its modules: :mod:`.keys` (key lists, the memo of decoded ones), :mod:`.descriptor` (the kv-get descriptor),
:mod:`.put_batch` (kv-put bodies), :mod:`.frames` (the response stream and :class:`TransferStats`); import from here.
"""

from .descriptor import _DESC_HEAD as _DESC_HEAD  # the header layout, for tests that edit descriptor bytes
from .descriptor import (
    DESCRIPTOR_MAGIC,
    DESCRIPTOR_VERSION,
    KEY_LIST_REF_BYTES,
    MAX_DESCRIPTOR_BYTES,
    MAX_LAYERS,
    MAX_PAYLOAD_BYTES,
    REGION_ID_BYTES,
    TOKEN_BYTES,
    Delivery,
    Descriptor,
    DescriptorFlag,
    Mode,
    Target,
    TransportKind,
    decode_descriptor,
    descriptor_transport,
    encode_descriptor,
)
from .frames import FRAME, FRAME_SIZE, Frame, FrameType, TransferStats, json_frame, pack_frame, unpack_frame
from .keys import _ENCODED_MEMO as _ENCODED_MEMO  # the memos, for tests that count their hits
from .keys import _KEY_MEMO as _KEY_MEMO
from .keys import KEY_LIST_MAGIC, KEY_MEMO_KEYS, KEY_MEMO_LISTS, MAX_KEY_BYTES, KeyList, decode_keys, encode_keys
from .put_batch import PUT_BATCH_MAGIC, decode_put_batch, encode_put_batch

__all__ = [
    "DESCRIPTOR_MAGIC", "DESCRIPTOR_VERSION", "FRAME", "FRAME_SIZE", "KEY_LIST_MAGIC", "KEY_LIST_REF_BYTES", "KEY_MEMO_KEYS", "KEY_MEMO_LISTS",
    "MAX_DESCRIPTOR_BYTES", "MAX_KEY_BYTES", "MAX_LAYERS", "MAX_PAYLOAD_BYTES", "PUT_BATCH_MAGIC", "REGION_ID_BYTES",
    "TOKEN_BYTES", "Delivery", "Descriptor", "DescriptorFlag", "Frame", "FrameType", "KeyList", "Mode", "Target",
    "TransferStats", "TransportKind", "decode_descriptor", "decode_keys",
    "decode_put_batch", "descriptor_transport", "encode_descriptor", "encode_keys", "encode_put_batch", "json_frame",
    "pack_frame", "unpack_frame",
]
