"""Which files to lint, and reading them with a clear error for each bad one.

Directories are walked with ``.gitignore`` files honoured (from the enclosing git
repository's root down), plus the usual tool folders and the configured ``exclude``
globs.  Files named explicitly are always linted.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from recheck.output.text import printable

__all__ = ["DEFAULT_MAX_FILE_SIZE", "FileError", "GitIgnore", "discover", "read_bytes", "read_source", "resolve"]

DEFAULT_MAX_FILE_SIZE = 5 * 1024 * 1024
#: A ``.gitignore`` larger than this is not read.
MAX_GITIGNORE_BYTES = 1 << 20
ALWAYS_SKIPPED = frozenset({
    ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "__pycache__", "node_modules",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", ".recheck_cache", ".eggs", "site-packages",
})


@dataclass(frozen=True)
class FileError:
    """A file (or a folder, ``kind="folder"``) that could not be linted, and why (printed as
    ``path: error: reason``)."""

    path: str
    reason: str
    kind: str = "file"

    def __str__(self) -> str:
        return f"{printable(self.path)}: error: {self.reason}"


def _glob_to_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern[i] == "*":
            out.append(".*" if pattern.startswith("**", i) else "[^/]*")
            i += 2 if pattern.startswith("**", i) else 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


class GitIgnore:
    """The ``.gitignore`` rules seen so far: (folder, regex, negated, directories only)."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, re.Pattern[str], bool, bool]] = []

    def load(self, folder: Path) -> None:
        data = read_bytes(folder / ".gitignore", MAX_GITIGNORE_BYTES)  # a FIFO or /dev/zero: not read
        if isinstance(data, str):
            return
        text = data.decode("utf-8", errors="replace")
        for raw in text.splitlines():
            line = raw.rstrip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            line = line[1:] if negated else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            body = _glob_to_regex(line.lstrip("/"))
            regex = re.compile(body + "$" if anchored else "(?:.*/)?" + body + "$")
            self.rules.append((str(folder.resolve()), regex, negated, dir_only))

    def ignored(self, path: Path, is_dir: bool) -> bool:
        """Whether ``path`` (absolute and normalized) is ignored; the last matching rule wins."""
        resolved, verdict = str(path), False
        for folder, regex, negated, dir_only in self.rules:
            if dir_only and not is_dir or not resolved.startswith(folder + os.sep):
                continue
            if regex.match(resolved[len(folder) + 1:]):
                verdict = not negated
        return verdict


def _excluded(path: Path, root: Path, patterns: list[str]) -> bool:
    """``path`` and ``root`` absolute and normalized."""
    if not patterns:
        return False
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError:
        relative = path.as_posix()
    return any(fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(path.name, p)
               or fnmatch.fnmatch(relative, p.rstrip("/") + "/*") for p in patterns)


def _git_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def discover(paths: Iterable[Path], root: Path, exclude: Iterable[str] = (),
             on_error: Callable[[Path, str], None] | None = None) -> Iterator[Path]:
    """Python files under ``paths`` (files given explicitly are always included).

    A folder that cannot be listed is passed to ``on_error`` with the reason (as an
    unreadable file is an error, never silently skipped)."""
    exclude = list(exclude)

    def unreadable(exc: OSError) -> None:
        if on_error is not None:
            on_error(Path(exc.filename) if exc.filename else start, f"cannot read folder: {exc.strerror or exc}")

    root = root.resolve()
    for start in paths:
        if not start.is_dir():  # a file named explicitly, also a FIFO or device: read_source judges it
            yield start
            continue
        ignore = GitIgnore()
        top = start.resolve()
        git_root = _git_root(top)
        if git_root is not None:
            for parent in reversed([top, *top.parents]):
                if parent == git_root or git_root in parent.parents:
                    if parent != top:
                        ignore.load(parent)
        for folder, dirs, files in os.walk(start, onerror=unreadable):
            here = Path(folder)
            absolute = top / here.relative_to(start)
            ignore.load(absolute)
            dirs[:] = sorted(
                d for d in dirs
                if d not in ALWAYS_SKIPPED and not d.endswith(".egg-info")
                and not ignore.ignored(absolute / d, True) and not _excluded(absolute / d, root, exclude)
            )
            for name in sorted(files):
                if name.endswith(".py") and not ignore.ignored(absolute / name, False) \
                        and not _excluded(absolute / name, root, exclude):
                    yield here / name


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


#: Reads past what ``stat`` said go in pieces of this size (a /proc file says size 0).
_CHUNK = 1 << 20


def _read_at_most(descriptor: int, limit: int, expected: int) -> bytes:
    """Up to ``limit`` bytes of an open file, whatever its size says: ``expected`` bytes are
    asked for first, then pieces of :data:`_CHUNK`, so no read allocates more than it can use."""
    pieces, total = [], 0
    want = min(expected, limit)
    while total < limit:
        piece = os.read(descriptor, max(1, min(want, limit - total)))
        if not piece:
            break
        pieces.append(piece)
        total += len(piece)
        want = _CHUNK
    return b"".join(pieces)


def resolve(path: Path) -> Path | str:
    """``path`` absolute with every symbolic link followed, or why it cannot be (a link
    loop, a folder swapped meanwhile): the one place the linter resolves a path it read."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop, before Python 3.13
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "a symbolic link loop"
        return f"cannot resolve path: {reason}"


def read_bytes(path: Path, max_bytes: int) -> bytes | str:
    """The bytes of a regular file of at most ``max_bytes``, or why it cannot be read.

    The file is opened without blocking (a FIFO would otherwise wait for a writer forever),
    checked on the open descriptor, and read in a bounded way whatever ``stat`` says.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return f"cannot read file: {exc.strerror or exc}"
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return f"is {_kind(info.st_mode)}, not a regular file; skipped"
        if info.st_size > max_bytes:
            return f"file is {info.st_size} bytes, larger than the {max_bytes}-byte limit (max-file-size); skipped"
        data = _read_at_most(descriptor, max_bytes + 1, info.st_size + 1)
        if len(data) > max_bytes:
            return f"file is over the {max_bytes}-byte limit (max-file-size); skipped"
    except OSError as exc:
        return f"cannot read file: {exc.strerror or exc}"
    finally:
        os.close(descriptor)
    return data


def read_source(path: Path, display: str, max_bytes: int = DEFAULT_MAX_FILE_SIZE) -> tuple[str, bytes] | FileError:
    """``(text, raw bytes)``, or the reason the file cannot be linted (only regular files
    of at most ``max_bytes`` are read: :func:`read_bytes`)."""
    data = read_bytes(path, max_bytes)
    if isinstance(data, str):
        return FileError(display, data)
    nul = data.find(b"\x00")
    if nul >= 0:
        return FileError(display, f"contains a NUL byte at offset {nul}; not Python source")
    try:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError:  # undecodable first lines, or an unknown declared encoding
            encoding = "utf-8"
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        detail = f"invalid byte 0x{data[exc.start]:02x} at offset {exc.start}" if isinstance(exc, UnicodeDecodeError) else str(exc)
        return FileError(display, f"not valid UTF-8 ({detail})")
    return text.lstrip("\ufeff"), data
