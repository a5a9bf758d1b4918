"""Key lists a session named (``DescriptorFlag.KEY_LIST_NAMED``), so its later kv-gets of the same prefix send a
16-byte reference instead of the keys (``KEY_LIST_REF``).

A reference resolves only within the session that named it: another session, of this tenant or another, never
reaches it. Bounded in lists per session and in keys overall (as many as the descriptor memo holds,
``KEY_MEMO_KEYS``; the lists are mostly that memo's own objects), least recently used dropped first (a session that
ended leaves its lists to age out); a reference no longer held is answered ``KVUnknownKeyList`` and the client sends
the keys again. Pure bookkeeping, no I/O; every step is O(1) but the count of a list's keys.
"""

from __future__ import annotations

from collections import OrderedDict

from protocol.wire import KEY_MEMO_KEYS

MAX_LISTS_PER_SESSION = 64
MAX_LISTS = 4096  # across every session (a bound on the tables' own size, whatever the lists' lengths)


class SessionKeyLists:
    def __init__(self, lists_per_session: int = MAX_LISTS_PER_SESSION, max_keys: int = KEY_MEMO_KEYS,
                 max_lists: int = MAX_LISTS) -> None:
        self.lists_per_session, self.max_keys, self.max_lists = lists_per_session, max_keys, max_lists
        self._lists: OrderedDict[tuple[bytes, bytes], list[str]] = OrderedDict()  # (session id, reference) -> keys, LRU
        self._sessions: dict[bytes, OrderedDict[bytes, None]] = {}  # each session's references, LRU
        self._keys = 0
        self.resolved = 0  # kv-gets whose keys came by reference

    def name(self, session_id: bytes, ref: bytes, keys: list[str]) -> None:
        """``keys`` are what ``ref`` means to this session from now on (replacing what it meant)."""
        if len(keys) > self.max_keys:
            return
        self._drop((session_id, ref))
        self._lists[(session_id, ref)] = keys
        mine = self._sessions.setdefault(session_id, OrderedDict())
        mine[ref] = None
        self._keys += len(keys)
        if len(mine) > self.lists_per_session:
            self._drop((session_id, next(iter(mine))))
        while self._keys > self.max_keys or len(self._lists) > self.max_lists:
            self._drop(next(iter(self._lists)))

    def named(self, session_id: bytes, ref: bytes) -> list[str] | None:
        """The keys this session named ``ref`` (None: never, or no longer held)."""
        keys = self._lists.get((session_id, ref))
        if keys is not None:
            self._lists.move_to_end((session_id, ref))
            self._sessions[session_id].move_to_end(ref)
            self.resolved += 1
        return keys

    def _drop(self, key: tuple[bytes, bytes]) -> None:
        keys = self._lists.pop(key, None)
        if keys is None:
            return
        self._keys -= len(keys)
        mine = self._sessions[key[0]]
        del mine[key[1]]
        if not mine:
            del self._sessions[key[0]]

    def status(self) -> dict[str, int]:
        return {"lists": len(self._lists), "keys": self._keys, "resolved": self.resolved}
