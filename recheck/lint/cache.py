"""A content-hash cache of phase-one facts: unchanged files are not parsed again.

Entries live in ``<cache_dir>/lint-v<version>/facts.pickle``; each key hashes the
file's bytes, its module name and the settings that change phase one.  A missing,
corrupt or unwritable cache is never an error: the file is simply parsed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

from recheck.lint.facts import FileFacts

__all__ = ["FORMAT_VERSION", "FactsCache", "code_fingerprint"]

#: Bump when the layout of the cache changes; the linter's own code is hashed into every key.
FORMAT_VERSION = "1"


def code_fingerprint() -> str:
    """A hash of the linter's source, so that an upgraded linter never reads stale facts."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


#: What reading a damaged or foreign pickle can raise: the entry is ignored.
_UNREADABLE = (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError)

class FactsCache:
    """Phase-one facts by content hash; ``directory=None`` disables caching.

    All entries live in one pack file, read once and rewritten at the end of a run that
    parsed something (one sequential read is much cheaper than a file per entry).
    """

    def __init__(self, directory: Path | None, settings: str = "") -> None:
        self.folder = directory / f"lint-v{FORMAT_VERSION}" if directory is not None else None
        self.settings = settings + ("|" + code_fingerprint() if directory is not None else "")
        self.hits = 0
        self._pack: dict[str, FileFacts] | None = None
        self._used: set[str] = set()
        self._dirty = False

    def key(self, data: bytes, module: str) -> str:
        digest = hashlib.sha256(data)
        digest.update(b"\0" + module.encode() + b"\0" + self.settings.encode())
        return digest.hexdigest()

    @property
    def pack_path(self) -> Path:
        assert self.folder is not None
        return self.folder / "facts.pickle"

    def _load(self) -> dict[str, FileFacts]:
        if self._pack is None:
            self._pack = {}
            if self.folder is not None:
                try:
                    with self.pack_path.open("rb") as handle:
                        pack = pickle.load(handle)
                    if isinstance(pack, dict):
                        self._pack = pack
                except _UNREADABLE:
                    pass
        return self._pack

    def get(self, key: str) -> FileFacts | None:
        if self.folder is None:
            return None
        facts = self._load().get(key)
        if isinstance(facts, FileFacts):
            self.hits += 1
            self._used.add(key)
            return facts
        return None

    def put(self, key: str, facts: FileFacts) -> None:
        if self.folder is None:
            return
        self._load()[key] = facts
        self._used.add(key)
        self._dirty = True

    @property
    def results_path(self) -> Path:
        assert self.folder is not None
        return self.folder / "results.pickle"

    def get_result(self, key: str) -> object | None:
        """The phase-two result stored for a tree whose every file is unchanged, if any."""
        if self.folder is None:
            return None
        try:
            with self.results_path.open("rb") as handle:
                stored_key, result = pickle.load(handle)
        except _UNREADABLE:
            return None
        return result if stored_key == key else None

    def put_result(self, key: str, result: object) -> None:
        """Remember the last tree's phase-two result (one entry: the tree linted last)."""
        if self.folder is not None:
            self._dump(self.results_path, (key, result))

    def flush(self) -> None:
        """Write the pack if this run added to it (stale entries are dropped when it grows)."""
        if self.folder is None or not self._dirty:
            return
        pack = self._load()
        if len(pack) > 4 * max(len(self._used), 1):
            pack = {k: v for k, v in pack.items() if k in self._used}
        self._dump(self.pack_path, pack)
        self._dirty = False

    def _dump(self, path: Path, value: object) -> None:
        """Write ``value`` to ``path`` atomically, in a cache folder tagged as one (a
        ``CACHEDIR.TAG`` and a ``.gitignore``); a cache that cannot be written is skipped."""
        assert self.folder is not None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tag = self.folder.parent / "CACHEDIR.TAG"
            if not tag.exists():
                tag.write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
                (self.folder.parent / ".gitignore").write_text("*\n")
            handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(handle, "wb") as stream:
                pickle.dump(value, stream, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, path)
        except OSError:
            pass
