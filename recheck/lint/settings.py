"""The linter's settings: ``[tool.recheck]`` merged with command-line flags, and rule selection."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from recheck.config import config_error
from recheck.lint.files import DEFAULT_MAX_FILE_SIZE
from recheck.lint.rules import ALL_CODES

__all__ = ["LintOptions", "SelectorError"]


class SelectorError(ValueError):
    """A rule selector (``--select``, ``ignore``, ...) that matches no rule."""


def _check_selectors(selectors: list[str], where: str) -> list[str]:
    normalized = [s.strip().upper() for s in selectors if s.strip()]
    for selector in normalized:
        if selector != "ALL" and not any(code.startswith(selector) for code in ALL_CODES):
            raise SelectorError(f"{where}: unknown rule selector {selector!r}; rules are {', '.join(ALL_CODES)}")
    return normalized


def _matches(code: str, selector: str) -> int:
    """How specific a match is (-1: no match); ``ALL`` is the least specific."""
    if selector == "ALL":
        return 0
    return len(selector) if code.startswith(selector) else -1


#: The cache folder when neither the user nor ``[tool.recheck]`` names one (in the project root).
DEFAULT_CACHE_DIR = ".recheck_cache"


def project_cache_dir(value: str, root: Path, source: object) -> Path:
    """The cache folder ``[tool.recheck] cache-dir`` names: a relative path to a folder below
    ``root``, the project's.  The file may be a stranger's, so it never chooses where recheck
    writes outside the project: anything else is a config error naming ``source`` and the key."""
    if Path(value).is_absolute() or os.path.isabs(value):
        raise config_error(source, "cache-dir", f"must be a relative path to a folder inside the project, "
                                                f"got {value!r} (--cache-dir or RECHECK_CACHE_DIR choose any folder)")
    normal = os.path.normpath(value)
    if normal in (os.curdir, os.pardir) or normal.startswith(os.pardir + os.sep):
        raise config_error(source, "cache-dir", f"must be a folder inside the project ({root}), got {value!r} "
                                                "(--cache-dir or RECHECK_CACHE_DIR choose any folder)")
    return root / normal


@dataclass
class LintOptions:
    """Everything a lint run needs to know besides the paths."""

    root: Path = field(default_factory=Path.cwd)
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    checkpoint_functions: list[str] = field(default_factory=list)
    cache_dir: Path | None = None
    #: The folder inside which no component of a ``cache_dir`` the project chose may be a
    #: symbolic link (the project root); None when the user chose the folder (``--cache-dir``).
    cache_root: Path | None = None
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    jobs: int = 0  # 0: one per CPU

    @classmethod
    def from_values(cls, values: Mapping[str, Any], root: Path, *, use_cache: bool = True, jobs: int = 0,
                    origins: Mapping[str, str] | None = None, cache_dir: Path | None = None,
                    source: object = "[tool.recheck]") -> LintOptions:
        """Build options from snake_case ``[tool.recheck]`` values (already merged with flags).

        ``origins`` names where each key's value came from (``pyproject.toml: [tool.recheck]
        ignore``, ``--ignore``), for the error an unknown rule selector raises.  ``cache_dir``:
        the folder the user chose (``--cache-dir``, ``RECHECK_CACHE_DIR``), used as given;
        otherwise the project's (``cache-dir`` from ``source``, or ``.recheck_cache``) must lie
        inside ``root`` (:func:`project_cache_dir`).
        """
        origins = origins or {}

        def where(key: str) -> str:
            return origins.get(key, key.replace("_", "-"))

        select = _check_selectors(values.get("select") or ["ALL"], where("select"))
        select += _check_selectors(values.get("extend_select") or [], where("extend_select"))
        per_file = {glob: _check_selectors(codes, f"{where('per_file_ignores')}[{glob!r}]")
                    for glob, codes in (values.get("per_file_ignores") or {}).items()}
        cache_root = None
        if not use_cache:
            cache_dir = None
        elif cache_dir is None:
            cache_dir = project_cache_dir(values.get("cache_dir") or DEFAULT_CACHE_DIR, root, source)
            cache_root = root
        return cls(
            root=root,
            select=select,
            ignore=_check_selectors(values.get("ignore") or [], where("ignore")),
            per_file_ignores=per_file,
            exclude=list(values.get("exclude") or []),
            checkpoint_functions=list(values.get("checkpoint_functions") or []),
            cache_dir=cache_dir,
            cache_root=cache_root,
            max_file_size=int(values.get("max_file_size") or DEFAULT_MAX_FILE_SIZE),
            jobs=jobs,
        )

    def enabled(self, code: str, path: str) -> bool:
        """Whether ``code`` is reported for the file at ``path`` (relative to ``root`` or not)."""
        chosen = max((_matches(code, s) for s in self.select), default=-1)
        dropped = max((_matches(code, s) for s in self.ignore), default=-1)
        if chosen < 0 or dropped >= chosen:
            return False
        posix = Path(path).as_posix()
        for glob, codes in self.per_file_ignores.items():
            if fnmatch.fnmatch(posix, glob) or fnmatch.fnmatch(Path(path).name, glob):
                if any(_matches(code, s) >= 0 for s in codes):
                    return False
        return True
