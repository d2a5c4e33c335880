"""``[tool.recheck]`` configuration from the nearest ``pyproject.toml``.

The first ``pyproject.toml`` at or above a start path with a ``[tool.recheck]`` table wins (as
Fixit does).  Keys may be kebab-case or snake_case (normalized to snake_case).  The file may be a
stranger's, so reading it is bounded (:data:`MAX_PYPROJECT_BYTES`), and every way it can fail
(unknown key, wrong type, not UTF-8, not TOML) is a :class:`ConfigError`,
``<file>: <key>: <reason>``, which the command line prints and exits 2 on."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,no-redef]

__all__ = ["SCHEMA", "TOLERANCES", "Config", "ConfigError", "config_error", "find_pyproject", "load_config",
           "watch_options"]


#: A ``pyproject.toml`` larger than this is not read (no project's is within orders of magnitude).
MAX_PYPROJECT_BYTES = 4 * 1024 * 1024
#: The largest ``max-file-size`` accepted: a source file is read into memory whole.
MAX_FILE_SIZE_LIMIT = 1 << 30


class ConfigError(ValueError):
    """The ``[tool.recheck]`` table is invalid; the message names the file and key."""


def config_error(source: object, key: str | None, reason: str) -> ConfigError:
    """The error of one configuration file: ``<file>: <key>: <reason>`` (no key: ``<file>: <reason>``)."""
    return ConfigError(f"{source}: {key}: {reason}" if key else f"{source}: {reason}")


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _whole(value: Any) -> bool:
    """A positive integer (a bool is none)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is(kind: type | tuple[type, ...]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


#: key -> (validator, description of the expected value, what it configures)
SCHEMA: Mapping[str, tuple[Callable[[Any], bool], str, str]] = {
    # linter
    "select": (_str_list, "a list of rule codes or prefixes", "rules the linter reports"),
    "ignore": (_str_list, "a list of rule codes or prefixes", "rules the linter skips"),
    "extend_select": (_str_list, "a list of rule codes or prefixes", "rules added to select"),
    "per_file_ignores": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and _str_list(x) for k, x in v.items()),
                         "a table of glob = [codes]", "rules skipped in matching files"),
    "exclude": (_str_list, "a list of glob patterns", "paths the linter skips"),
    "checkpoint_functions": (_str_list, "a list of dotted names", "extra functions that checkpoint their first argument"),
    "cache_dir": (_is(str), "a path", "where the linter keeps its cache"),
    "max_file_size": (lambda v: _whole(v) and v <= MAX_FILE_SIZE_LIMIT,
                      f"a positive number of bytes, at most {MAX_FILE_SIZE_LIMIT}", "larger files are skipped"),
    # dynamic checker, watch and the pytest plugin
    "early_stop": (_is(bool), "true or false",
                   "watch: false replays every recomputation fully, true forces early stop (default: as called)"),
    "strict": (_is(bool), "true or false", "the old name of early-stop = false"),
    "store": (lambda v: v in ("digest", "copy"), '"digest" or "copy"', "what watch() keeps of each forward"),
    "report": (_is(str), "a path", "where pytest --recheck writes its JSON report"),
    "atol": (_is((int, float)), "a number", "absolute tolerance (default: exact)"),
    "rtol": (_is((int, float)), "a number", "relative tolerance (default: exact)"),
    "max_ulp": (_whole, "a positive integer", "tolerance in units in the last place"),
}


def find_pyproject(start: Path | str | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` with a ``[tool.recheck]`` table."""
    here = Path(start or Path.cwd()).resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and "recheck" in _read_tool_tables(candidate):
            return candidate
    return None


def _read_tool_tables(path: Path) -> dict[str, Any]:
    """The ``[tool]`` table of ``path``; every way reading it can fail is a :class:`ConfigError`."""
    try:
        with path.open("rb") as handle:  # bounded whatever stat says (a /proc file reads as size 0)
            raw = handle.read(MAX_PYPROJECT_BYTES + 1)
        if len(raw) > MAX_PYPROJECT_BYTES:
            raise config_error(path, None, f"larger than {MAX_PYPROJECT_BYTES} bytes; not read")
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except ConfigError:
        raise
    except tomllib.TOMLDecodeError as exc:
        raise config_error(path, None, f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise config_error(path, None, f"not valid UTF-8 (invalid byte 0x{exc.object[exc.start]:02x} "
                                       f"at offset {exc.start})") from None
    except (RecursionError, MemoryError) as exc:
        raise config_error(path, None, f"nested too deeply to parse ({type(exc).__name__})") from None
    except OSError as exc:
        raise config_error(path, None, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # anything else tomllib rejects
        raise config_error(path, None, f"not valid TOML: {exc}") from None
    tool = data.get("tool", {})
    return tool if isinstance(tool, dict) else {}


def normalize_key(key: str) -> str:
    return key.replace("-", "_")


def validate(table: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Check every key and value of a ``[tool.recheck]``-style table; return snake_case keys."""
    values: dict[str, Any] = {}
    for raw_key, value in table.items():
        key = normalize_key(raw_key)
        if key not in SCHEMA:
            known = ", ".join(k.replace("_", "-") for k in SCHEMA)
            raise config_error(source, raw_key, f"unknown key in [tool.recheck]; known keys: {known}")
        check, expected, _ = SCHEMA[key]
        if not check(value):
            raise config_error(source, raw_key, f"invalid value in [tool.recheck]: expected {expected}, "
                                                f"got {_shown_value(value)}")
        if key in values:
            raise config_error(source, raw_key, "given twice in [tool.recheck] (kebab-case and snake_case)")
        values[key] = value
    return values


def _shown_value(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut short: a value from a stranger's file may be huge or deeply nested."""
    try:
        shown = repr(value)
    except (RecursionError, MemoryError):
        return f"a deeply nested {type(value).__name__}"
    return shown if len(shown) <= limit else shown[:limit] + "..."


@dataclass(frozen=True)
class Config:
    """The validated ``[tool.recheck]`` table and where it came from (None: defaults)."""

    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """The folder paths in the configuration are relative to."""
        return self.path.parent if self.path else Path.cwd()

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(normalize_key(key), default)

    def merged(self, overrides: Mapping[str, Any]) -> Config:
        """A copy where every override that is not None replaces the file's value."""
        values = dict(self.values)
        values.update({normalize_key(k): v for k, v in overrides.items() if v is not None})
        return Config(self.path, values)


def load_config(start: Path | str | None = None, *, path: Path | str | None = None) -> Config:
    """Load ``[tool.recheck]``: from ``path`` if given, else the nearest one above ``start``."""
    if path is not None:
        pyproject = Path(path)
        if not pyproject.is_file():
            raise config_error(pyproject, None, "no such configuration file")
    else:
        found = find_pyproject(start)
        if found is None:
            return Config()
        pyproject = found
    table = _read_tool_tables(pyproject).get("recheck", {})
    if not isinstance(table, dict):
        raise config_error(pyproject, "tool.recheck", "must be a table")
    return Config(pyproject, validate(table, str(pyproject)))


#: The keys of a tolerance: one setting, ``atol``/``rtol`` or ``max_ulp``.
TOLERANCES = ("atol", "rtol", "max_ulp")


def watch_options(table: Mapping[str, Any], *, early_stop: bool | None = None, strict: bool | None = None,
                  store: str | None = None, tolerance: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``recheck.watch()``'s options from a face's flags over the ``[tool.recheck]`` values ``table``
    (``recheck check --step``, ``recheck run``, ``pytest --recheck``); not yet validated.

    ``strict`` is the old name of ``early_stop=False``; a tolerance given by flags replaces the
    table's as a whole (a tolerance is one setting)."""
    given = {k: v for k, v in (tolerance or {}).items() if v is not None}
    if early_stop is None:
        early_stop = False if strict else table.get("early_stop", False if table.get("strict") else None)
    return {"early_stop": early_stop, "store": store or table.get("store"),
            **(given or {n: table[n] for n in TOLERANCES if n in table}),
            "checkpoint_functions": table.get("checkpoint_functions")}
