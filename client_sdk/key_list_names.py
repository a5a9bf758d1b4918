"""The key lists this process named on its local session (``DescriptorFlag.KEY_LIST_NAMED``), so a prefix fetched
again sends a 16-byte reference instead of its keys (``KEY_LIST_REF``): 57 KB for a 3,584-key prefix, encoded,
sent, read and hashed on every kv-get before its first layer.

A name is this process's random choice, meaningful only to the session it was sent on (the node keeps it per
session and may let it go: the kv-get is then sent with its keys again). Found by (count, first key, last key),
then checked equal to a copy of the keys, as the descriptor's own key-section memo is.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections import OrderedDict

from protocol.wire import KEY_LIST_REF_BYTES, Descriptor, encode_descriptor

MAX_NAMES = 64  # as many as the node keeps per session (storage_server.session_key_lists.MAX_LISTS_PER_SESSION)


class KeyListNames:
    def __init__(self, max_names: int = MAX_NAMES) -> None:
        self.max_names = max_names
        self.enabled = True  # False: the node predates KEY_LIST_NAMED, descriptors go plain
        self._names: OrderedDict[tuple[int, str, str], tuple[list[str], bytes]] = OrderedDict()

    def encode(self, d: Descriptor, by_ref: bool = True) -> bytes:
        """``d`` as the session socket takes it: by its reference if these keys were named before (and ``by_ref``),
        else with its keys and a reference for next time (a new one: the node may hold the old under another list)."""
        if not self.enabled:
            return encode_descriptor(d)
        keys = d.chunk_keys
        at = (len(keys), keys[0], keys[-1])
        known = self._names.get(at)
        if by_ref and known is not None and known[0] == keys:
            self._names.move_to_end(at)
            return encode_descriptor(dataclasses.replace(d, key_ref=known[1], keys_by_ref=True))
        ref = secrets.token_bytes(KEY_LIST_REF_BYTES)
        self._names[at] = (list(keys), ref)
        self._names.move_to_end(at)
        while len(self._names) > self.max_names:
            self._names.popitem(last=False)
        return encode_descriptor(dataclasses.replace(d, key_ref=ref))

    def clear(self) -> None:
        self._names.clear()

    def __len__(self) -> int:
        return len(self._names)
