"""A bucket's lifecycle configuration: the subset ObjectCache applies, S3's ``AbortIncompleteMultipartUpload``.

A rule names a key prefix (``Filter/Prefix``, or the older bare ``Prefix``), is Enabled or Disabled, and
aborts multipart uploads under that prefix ``DaysAfterInitiation`` days after they were initiated. The
gateway parses the XML into these records (and refuses every other action or filter as not implemented,
naming it); the stores keep them with the bucket (local: a column of its row; s3: its bucket record);
housekeeping (:mod:`storage_server.upload_expiry`) applies them with ``storage_server.abort_incomplete_uploads_s``,
whichever expires an upload first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DAY_S = 86400.0
MAX_RULES = 1000  # S3's own limit on rules in one configuration


@dataclass(frozen=True)
class LifecycleRule:
    id: str
    prefix: str
    enabled: bool
    abort_after_days: int
    legacy_prefix: bool = False  # given as the bare <Prefix> element rather than <Filter><Prefix>: echoed that way

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "prefix": self.prefix, "enabled": self.enabled, "abort_after_days": self.abort_after_days,
                "legacy_prefix": self.legacy_prefix}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LifecycleRule:
        return cls(str(raw["id"]), str(raw["prefix"]), bool(raw["enabled"]), int(raw["abort_after_days"]), bool(raw.get("legacy_prefix", False)))


def rules_to_json(rules: Sequence[LifecycleRule]) -> list[dict[str, Any]]:
    return [r.to_json() for r in rules]


def rules_from_json(raw: Sequence[dict[str, Any]] | None) -> tuple[LifecycleRule, ...]:
    return tuple(LifecycleRule.from_json(r) for r in raw or ())


def abort_after_s(key: str, rules: Sequence[LifecycleRule], default_s: float) -> float:
    """How long after its initiation an upload of ``key`` is aborted: the soonest of the bucket's enabled
    rules whose prefix the key has and of ``default_s`` (0 = never); 0 when nothing applies."""
    limits = [r.abort_after_days * DAY_S for r in rules if r.enabled and key.startswith(r.prefix)]
    if default_s > 0:
        limits.append(default_s)
    return min(limits) if limits else 0.0
