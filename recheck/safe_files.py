"""Writing a user's file all or nothing: :func:`write_atomically`.

A file rewritten in place (``open(path, "w")``) is empty from the truncate until the last
write lands: a kill, a Ctrl-C or a full disk in between loses it.  Here the new contents go
to a temporary file in the same folder (so the rename never crosses a file system), which is
flushed and fsynced, given the original's permission bits, then renamed over the original
with :func:`os.replace` (atomic on POSIX and Windows).  Until that rename the original is
untouched; after it, the new contents are complete.

What a replace cannot keep: the original's inode, so a hard link elsewhere keeps the old
contents (never the new ones: a rewrite through a link cannot reach a file outside), and
extended attributes or ACLs.  The owner and group are kept where the process may set them.
Nothing here imports torch or libcst.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = ["TEMPORARY_SUFFIX", "write_atomically"]

#: The temporary file is ``.<name>.<random>.recheck-tmp`` beside the target: hidden, and never
#: mistaken for a source file by a linter walking the folder.  Only a SIGKILL or a power cut
#: between its creation and the rename can leave one behind (the original is then whole).
TEMPORARY_SUFFIX = ".recheck-tmp"


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the contents of ``path`` with ``data``: afterwards the file holds either all of
    ``data`` or exactly what it held before, whatever fails or interrupts the write.

    ``path`` is the file itself, not a symbolic link to it: the rename would replace the link
    (callers resolve links first and decide whether the target may be written).  The file keeps
    its permission bits (a new file gets the umask's).  Raises :class:`OSError` on failure, with
    the temporary file already removed and the original unchanged.
    """
    target = Path(path)
    try:
        info: os.stat_result | None = os.stat(target, follow_symlinks=False)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):  # a link, a folder, a FIFO: never replaced
        raise OSError(errno.EINVAL, "not a regular file", str(target))
    descriptor, temporary = _create_temporary(target, 0o600 if info is not None else 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _copy_mode(temporary, info)
        os.replace(temporary, target)
    except BaseException:  # an error, a Ctrl-C: the original was never touched
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_folder(target.parent)


def _create_temporary(target: Path, mode: int) -> tuple[int, Path]:
    """A new file beside ``target`` (never an existing one, never through a link), opened for
    writing; ``mode`` less the umask, as ``open(path, "w")`` would create it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        candidate = target.parent / f".{target.name[:200]}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}"
        try:
            return os.open(candidate, flags, mode), candidate
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(target.parent))


def _copy_mode(temporary: Path, info: os.stat_result | None) -> None:
    """Give the temporary file the original's permission bits and, where allowed, its owner
    (a new file keeps the mode it was created with)."""
    if info is None:
        return
    mine = os.stat(temporary)
    if hasattr(os, "chown") and (info.st_uid, info.st_gid) != (mine.st_uid, mine.st_gid):
        with contextlib.suppress(OSError):  # only root may give a file away; a group we are in is fine
            os.chown(temporary, info.st_uid, info.st_gid)
    os.chmod(temporary, stat.S_IMODE(info.st_mode))  # after chown, which may clear setuid bits


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a folder that cannot be opened is left as is."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        descriptor = os.open(folder, flags)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
