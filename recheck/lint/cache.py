"""A content-hash cache of phase-one facts (and of the last tree's result), kept as data.

Entries live in ``<cache_dir>/lint-v<version>/facts.json`` and ``result.json``; each key
hashes the file's bytes, its module name, the settings that change phase one and the
linter's own source.  The cache sits in the linted tree, which may be a stranger's, so it
is JSON (never pickle: loading a pickle runs what it says) with a header naming its
format and version, and every value is validated against the linter's data types on load
(:mod:`recheck.lint.typed_json`).  A file that is missing, from another version, corrupt
or invalid is ignored and rewritten, with one warning per run that says whether it was
rewritten; a cache that cannot be written is skipped.  Caches of earlier versions (``lint-v1/*.pickle``) are never read.

Where the cache lives is the user's choice or the project's, never the tree's beyond the
project: a folder the project names (``cache-dir``, or the default ``.recheck_cache``) is
not used at all, with one warning, when it or any folder between it and the project root
is a symbolic link (a tree could ship ``.recheck_cache`` as a link to any folder, which the
tags would then mark as a cache that backups skip and git ignores).  The ``lint-v2``
folder and the tags are never written through a link wherever the cache lives.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from recheck.lint.facts import FileFacts
from recheck.lint.typed_json import InvalidData, decoder, dumps

__all__ = ["FORMAT", "FORMAT_VERSION", "FactsCache", "code_fingerprint"]

#: Bump when the layout of the cache changes; the linter's own code is hashed into every key.
FORMAT_VERSION = 2
FORMAT = "recheck-lint-cache"
#: A cache file larger than this is not read (it cannot be one this linter wrote for a tree
#: that fits in memory, and reading it would only cost time).
MAX_CACHE_BYTES = 1 << 30
T = TypeVar("T")


def code_fingerprint() -> str:
    """A hash of the linter's source, so that an upgraded linter never reads stale facts."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass
class _Pack:
    """The body of ``facts.json``: facts of the files parsed, and the verdict of the
    files only checked for syntax (``""`` when it parses, else the error line's reason)."""

    facts: dict[str, FileFacts] = field(default_factory=dict)
    checked: dict[str, str] = field(default_factory=dict)


class FactsCache:
    """Phase-one facts by content hash; ``directory=None`` disables caching.

    All entries live in one pack file, read once and rewritten at the end of a run that
    parsed something (one sequential read is much cheaper than a file per entry).
    """

    def __init__(self, directory: Path | None, settings: str = "", inside: Path | None = None) -> None:
        """``inside``: the project root when the project chose ``directory`` (no folder from
        there down may be a symbolic link); None when the user chose it."""
        #: The cache folder not used (at most one line); see :attr:`warnings`.
        self._unused: list[str] = []
        #: The first cache file ignored this run, why, and what became of it (see :meth:`_write`).
        self._ignored: tuple[Path, str] | None = None
        self._outcome = "it was left as it is"
        self.inside = inside
        if directory is not None:
            link = _symbolic_link(directory / f"lint-v{FORMAT_VERSION}", inside)
            if link is not None:
                self._unused.append(f"recheck lint: warning: the cache folder {directory} is not used: {link} "
                                     "is a symbolic link; linting without the cache")
                directory = None
        self.folder = directory / f"lint-v{FORMAT_VERSION}" if directory is not None else None
        self.settings = settings + ("|" + code_fingerprint() if directory is not None else "")
        self.hits = 0
        self._pack: _Pack | None = None
        self._used: set[str] = set()
        self._dirty = False

    def key(self, data: bytes, module: str, salt: str = "") -> str:
        """The entry key of a file's bytes under ``module``; ``salt`` names what else its
        facts depend on (the entry points discovered in the tree)."""
        digest = hashlib.sha256(data)
        digest.update(b"\0" + module.encode() + b"\0" + self.settings.encode() + b"\0" + salt.encode())
        return digest.hexdigest()

    @property
    def pack_path(self) -> Path:
        assert self.folder is not None
        return self.folder / "facts.json"

    @property
    def results_path(self) -> Path:
        assert self.folder is not None
        return self.folder / "result.json"

    def _read(self, path: Path, kind: str, schema: Any) -> Any:
        """The validated body of one cache file, or None (ignored, with one warning per run)."""
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_CACHE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._ignore(path, f"cannot be read ({exc.strerror or exc})")
        if len(data) > MAX_CACHE_BYTES:
            return self._ignore(path, f"is larger than {MAX_CACHE_BYTES} bytes")
        try:
            document = json.loads(data)
            if type(document) is not dict or set(document) != {"format", "version", "kind", "settings", "body"}:
                raise InvalidData("not a recheck lint cache file")
            if document["format"] != FORMAT or document["version"] != FORMAT_VERSION or document["kind"] != kind:
                raise InvalidData(f"written in format {document['format']!r} version {document['version']!r}")
            if document["settings"] != self.settings:
                return None  # written by another version of the linter, or other settings: stale, not bad
            return decoder(schema)(document["body"])
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, InvalidData
            return self._ignore(path, f"is not valid ({exc})")

    def _ignore(self, path: Path, why: str) -> None:
        if self._ignored is None:
            self._ignored = (path, why)
        return None

    @property
    def warnings(self) -> list[str]:
        """At most one line: the cache folder not used, or the first cache file ignored and
        whether this run rewrote it (read once the run has written what it will)."""
        if self._unused or self._ignored is None:
            return list(self._unused)
        path, why = self._ignored
        return [f"recheck lint: warning: ignored the cache file {path}: it {why}; {self._outcome}"]

    def _load(self) -> _Pack:
        if self._pack is None:
            self._pack = _Pack()
            if self.folder is not None:
                pack = self._read(self.pack_path, "facts", _Pack)
                if pack is not None:
                    self._pack = pack
        return self._pack

    def get(self, key: str) -> FileFacts | None:
        if self.folder is None:
            return None
        facts = self._load().facts.get(key)
        if facts is not None:
            self.hits += 1
            self._used.add(key)
        return facts

    def put(self, key: str, facts: FileFacts) -> None:
        if self.folder is None:
            return
        self._load().facts[key] = facts
        self._used.add(key)
        self._dirty = True

    def get_checked(self, key: str) -> str | None:
        """The stored syntax verdict of a file (``""``: it parses), or None if unknown."""
        if self.folder is None:
            return None
        verdict = self._load().checked.get(key)
        if verdict is not None:
            self._used.add(key)
        return verdict

    def put_checked(self, key: str, verdict: str) -> None:
        if self.folder is None:
            return
        self._load().checked[key] = verdict
        self._used.add(key)
        self._dirty = True

    def get_result(self, key: str, schema: type[T]) -> T | None:
        """The phase-two result stored for a tree whose every file is unchanged, if any."""
        if self.folder is None:
            return None
        stored = self._read(self.results_path, "result", tuple[str, schema])  # type: ignore[valid-type]
        return stored[1] if stored is not None and stored[0] == key else None

    def put_result(self, key: str, result: object) -> None:
        """Remember the last tree's phase-two result (one entry: the tree linted last)."""
        if self.folder is not None:
            self._write(self.results_path, "result", (key, result))

    def flush(self) -> None:
        """Write the pack if this run added to it (stale entries are dropped when it grows)."""
        if self.folder is None or not self._dirty:
            return
        pack = self._load()
        if len(pack.facts) + len(pack.checked) > 4 * max(len(self._used), 1):
            pack = _Pack({k: v for k, v in pack.facts.items() if k in self._used},
                         {k: v for k, v in pack.checked.items() if k in self._used})
        self._write(self.pack_path, "facts", pack)
        self._dirty = False

    def _write(self, path: Path, kind: str, body: object) -> None:
        """Write one cache file atomically; a cache that cannot be written is skipped."""
        assert self.folder is not None
        try:
            text = dumps({"format": FORMAT, "version": FORMAT_VERSION, "kind": kind,
                          "settings": self.settings, "body": body})
        except (TypeError, ValueError, RecursionError):
            return
        try:
            self._make_folder()
            _replace(path, text.encode("utf-8"))
        except OSError as exc:
            if self._ignored is not None and self._ignored[0] == path:
                self._outcome = f"it could not be rewritten ({exc.strerror or exc})"
            return
        if self._ignored is not None and self._ignored[0] == path:
            self._outcome = "it was rewritten"

    def _make_folder(self) -> None:
        """Create the cache folder; one that this run creates is tagged as a cache
        (``CACHEDIR.TAG``, and a ``.gitignore`` of ``*``).  Tags are written by atomic
        replacement, so a planted symbolic link is replaced, never written through."""
        assert self.folder is not None
        top = self.folder.parent
        if _symbolic_link(self.folder, self.inside) is not None:  # planted since the run began
            raise OSError("the cache folder is a symbolic link: not written through")
        created = not top.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        if created or not (top / "CACHEDIR.TAG").is_file():
            if created or not (top / ".gitignore").exists():
                _replace(top / ".gitignore", b"*\n")
            _replace(top / "CACHEDIR.TAG", b"Signature: 8a477f597d28d172789f06886806bc55\n")


def _symbolic_link(folder: Path, inside: Path | None) -> Path | None:
    """The first symbolic link among ``folder`` and the folders between it and ``inside``
    (``inside`` itself excluded; without ``inside``, ``folder`` alone), or None."""
    chain = [folder]
    if inside is not None:
        try:
            below = folder.relative_to(inside)
        except ValueError:
            return folder  # not inside the project at all: never used (callers keep it inside)
        chain = [inside.joinpath(*below.parts[:n]) for n in range(1, len(below.parts) + 1)]
    return next((path for path in chain if path.is_symlink()), None)


def _replace(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
