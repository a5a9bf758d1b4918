"""Key lists a session named (``DescriptorFlag.KEY_LIST_NAMED``), so its later kv-gets of the same prefix send a
16-byte reference instead of the keys (``KEY_LIST_REF``).

A reference resolves only within the session that named it: another session, of this tenant or another, never
reaches it. Bounded in lists per session and in keys overall, least recently used dropped first (a session that
ended leaves its lists to age out); a reference no longer held is answered ``KVUnknownKeyList`` and the client sends
the keys again. Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_LISTS_PER_SESSION = 64
MAX_KEYS = 1 << 20  # across every session: 3,584-key prefixes, ~290 of them


class SessionKeyLists:
    def __init__(self, lists_per_session: int = MAX_LISTS_PER_SESSION, max_keys: int = MAX_KEYS) -> None:
        self.lists_per_session, self.max_keys = lists_per_session, max_keys
        self._lists: OrderedDict[tuple[bytes, bytes], list[str]] = OrderedDict()  # (session id, reference) -> keys
        self._per_session: dict[bytes, int] = {}
        self._keys = 0
        self.resolved = 0  # kv-gets whose keys came by reference

    def name(self, session_id: bytes, ref: bytes, keys: list[str]) -> None:
        """``keys`` are what ``ref`` means to this session from now on (replacing what it meant)."""
        if len(keys) > self.max_keys:
            return
        self._drop((session_id, ref))
        self._lists[(session_id, ref)] = keys
        self._per_session[session_id] = self._per_session.get(session_id, 0) + 1
        self._keys += len(keys)
        while self._per_session[session_id] > self.lists_per_session:
            self._drop(next(k for k in self._lists if k[0] == session_id))
        while self._keys > self.max_keys:
            self._drop(next(iter(self._lists)))

    def named(self, session_id: bytes, ref: bytes) -> list[str] | None:
        """The keys this session named ``ref`` (None: never, or no longer held)."""
        keys = self._lists.get((session_id, ref))
        if keys is not None:
            self._lists.move_to_end((session_id, ref))
            self.resolved += 1
        return keys

    def _drop(self, key: tuple[bytes, bytes]) -> None:
        keys = self._lists.pop(key, None)
        if keys is None:
            return
        self._keys -= len(keys)
        left = self._per_session[key[0]] - 1
        if left:
            self._per_session[key[0]] = left
        else:
            del self._per_session[key[0]]

    def status(self) -> dict[str, int]:
        return {"lists": len(self._lists), "keys": self._keys, "resolved": self.resolved}
