"""Loading a :class:`Config`: TOML file, then ``OBJECTCACHE_*`` environment, then explicit overrides.

Raw values are merged into one tree of dicts and built table by table, so an unknown key, an
unknown variable or a bad value is refused with its name (:class:`ConfigError`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from .schema import ENV_PREFIX, ENV_VARS, Config, KeyPath, array_type, env_name, hints, table_type
from .sections import ConfigError, Section

# Keys renamed since earlier releases: an old config is refused with a pointer to the new name.
RENAMED = {
    "gateway.max_keys": "gateway.max_list_keys",
    "store.io_threads": "store.local.io_threads",
    "storage_server.io_threads": "storage_server.read_threads",
    "storage_server.max_keys": "storage_server.max_descriptor_keys",
}


def _coerce(where: str, tp: Any, value: Any) -> Any:
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return value.lower() in ("1", "true", "yes", "on")
            raise ValueError
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise ValueError
            return value
        if tp == tuple[str, ...]:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return tuple(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: bad value {value!r} (expected {tp.__name__ if isinstance(tp, type) else tp})") from None
    raise ConfigError(f"{where}: unsupported type {tp}")


def _renamed(dotted: str) -> str:
    return f" (renamed to {RENAMED[dotted]})" if dotted in RENAMED else ""


def _table(cls: type[Section], path: KeyPath, raw: Any) -> Any:
    """Build one table from its raw TOML value, sub-tables and arrays of tables included."""
    where = ".".join(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"[{where}] must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown and not path:
        raise ConfigError(f"unknown section(s): {', '.join(unknown)} (known: {', '.join(known)})")
    if unknown:
        names = ", ".join(f"{where}.{k}{_renamed(f'{where}.{k}')}" for k in unknown)
        raise ConfigError(f"unknown key(s) in [{where}]: {names} (known: {', '.join(known)})")
    missing = [k for k, f in known.items() if f.default is MISSING and f.default_factory is MISSING and k not in raw]
    if missing:
        raise ConfigError(f"[{where}] is missing required key(s): {', '.join(missing)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        tp = hints(cls)[key]
        if sub := table_type(tp):
            values[key] = _table(sub, (*path, key), value)
        elif elem := array_type(tp):
            if not isinstance(value, list):
                raise ConfigError(f"{key}: expected an array of tables ([[{key}]])")
            values[key] = tuple(_table(elem, (*path, f"{key}[{i}]"), v) for i, v in enumerate(value))
        else:
            values[key] = _coerce(".".join((*path, key)), tp, value)
    return cls(**values)


def _env_value(var: str, path: KeyPath, text: str) -> Any:
    """An override's raw value; an array of tables takes entries of its required keys joined by ':'."""
    elem = array_type(hints(Config).get(path[0])) if len(path) == 1 else None
    if elem is None:
        return text
    required = [f.name for f in fields(elem) if f.default is MISSING and f.default_factory is MISSING]
    entries = []
    for entry in filter(None, text.split(",")):
        parts = entry.split(":")
        if len(parts) != len(required):
            raise ConfigError(f"{var}: entry {parts[0]!r} is not {':'.join(required)}")
        entries.append(dict(zip(required, parts, strict=True)))
    return entries


def _set(raw: dict[str, Any], path: KeyPath, value: Any) -> None:
    node = raw
    for i, key in enumerate(path[:-1]):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"[{'.'.join(path[:i + 1])}] must be a table")
    node[path[-1]] = value


def _env_path(var: str) -> KeyPath:
    if var in ENV_VARS:
        return ENV_VARS[var]
    old = {env_name(tuple(k.split("."))): env_name(tuple(v.split("."))) for k, v in RENAMED.items()}
    hint = f" (renamed to {old[var]})" if var in old else ""
    raise ConfigError(f"unknown environment variable {var}{hint} (known: {', '.join(ENV_VARS)})")


def load_config(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Read TOML (if given), apply environment, then explicit overrides (``section__key=value``, None skipped)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = _read_toml(path) if path is not None else {}
    inline_tenants = "tenants" in raw
    for var in sorted(v for v in env if v.startswith(ENV_PREFIX)):
        key_path = _env_path(var)
        _set(raw, key_path, _env_value(var, key_path, env[var]))
    for key, value in overrides.items():
        if value is not None:
            _set(raw, tuple(key.split("__")), value)
    tenants_file = raw.get("tenants_file")
    if tenants_file and env_name(("tenants",)) not in env:  # OBJECTCACHE_TENANTS replaces the list wherever it came from
        if inline_tenants:
            raise ConfigError("tenants: give [[tenants]] or tenants_file, not both")
        shared = _read_toml(tenants_file)
        if not isinstance(shared, dict) or set(shared) - {"tenants"}:
            raise ConfigError(f"tenants_file {tenants_file}: holds only [[tenants]] (found: {', '.join(sorted(set(shared) - {'tenants'}))})")
        raw["tenants"] = shared.get("tenants", [])
    return _table(Config, (), raw)


def _read_toml(path: str | os.PathLike) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
