"""Pin counts, the part every eviction policy shares: a chunk pinned n times is held until unpinned n times."""

from __future__ import annotations

from collections.abc import Iterable


class PinCounts:
    """Mixed into a policy: ``_pins`` maps a pinned key to how many holders it has (a transfer, a fetch)."""

    _pins: dict[str, int]

    def pin(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, keys: Iterable[str]) -> None:
        for key in keys:
            n = self._pins.get(key, 0) - 1
            if n > 0:
                self._pins[key] = n
            else:
                self._pins.pop(key, None)

    def pinned(self, key: str) -> bool:
        return key in self._pins
