"""The key lists this process named on its local session (``DescriptorFlag.KEY_LIST_NAMED``), so a prefix fetched
again sends a 16-byte reference instead of its keys (``KEY_LIST_REF``): 57 KB for a 3,584-key prefix, encoded,
sent, read and hashed on every kv-get before its first layer.

A name is this process's random choice, meaningful only to the session it was sent on (the node keeps it per
session and may let it go: the kv-get is then sent with its keys again). Held in the descriptor's own kind of memo,
found by equal keys (:meth:`protocol.wire.keys.KeyMemo.find`).
"""

from __future__ import annotations

import dataclasses
import secrets

from protocol.wire import KEY_LIST_REF_BYTES, Descriptor, encode_descriptor
from protocol.wire.keys import KeyMemo

MAX_NAMES = 64  # as many as the node keeps per session (storage_server.session_key_lists.MAX_LISTS_PER_SESSION)


class KeyListNames:
    def __init__(self, max_names: int = MAX_NAMES) -> None:
        self.enabled = True  # False: the node predates KEY_LIST_NAMED, descriptors go plain
        self.refs = KeyMemo(lists=max_names)  # keys -> the reference they were named by

    def encode(self, d: Descriptor, by_ref: bool = True) -> bytes:
        """``d`` as the session socket takes it: by its reference if these keys were named before (and ``by_ref``),
        else with its keys and a reference for next time (a new one: the node may hold the old under another list)."""
        if not self.enabled:
            return encode_descriptor(d)
        ref = self.refs.find(d.chunk_keys) if by_ref else None
        if ref is not None:
            return encode_descriptor(dataclasses.replace(d, key_ref=ref, keys_by_ref=True))
        ref = secrets.token_bytes(KEY_LIST_REF_BYTES)
        self.refs.remember(d.chunk_keys, ref)
        return encode_descriptor(dataclasses.replace(d, key_ref=ref))

    def clear(self) -> None:
        self.refs.clear()
