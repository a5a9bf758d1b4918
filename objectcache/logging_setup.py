"""Logging for every process, from ``[log]``: level, ``text`` or ``json`` lines, and the access log.

Access lines (logger ``objectcache.access`` and its children) carry their fields
in ``record.fields``; they are logged at INFO and stay on when ``log.level`` is
WARNING, because an operator who turns the access log on wants it without the
daemon's debug chatter. Only fields the code chose are written: no header,
signature or key ever reaches a log line.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from protocol.config import LogConfig

ACCESS_LOGGER = "objectcache.access"
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; an access record's fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname, "logger": record.name}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(cfg: LogConfig) -> None:
    """Replace the root handler (stderr) with one in the configured format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if cfg.format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(cfg.level.upper())
    access = logging.getLogger(ACCESS_LOGGER)
    access.setLevel(logging.INFO if cfg.access else logging.CRITICAL + 1)
