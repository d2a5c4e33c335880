"""``write_atomically``: a file holds all of its new contents or exactly its old ones."""

from __future__ import annotations

import errno
import os

import pytest

from recheck import safe_files
from recheck.safe_files import TEMPORARY_SUFFIX, write_atomically

OLD = b"old contents\r\n\xff\n"
NEW = b"new contents, longer than the old ones\n"


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_replaces_the_contents_and_keeps_the_mode(tmp_path):
    path = tmp_path / "m.py"
    path.write_bytes(OLD)
    path.chmod(0o751)
    write_atomically(path, NEW)
    assert path.read_bytes() == NEW
    assert path.stat().st_mode & 0o7777 == 0o751
    assert os.listdir(tmp_path) == ["m.py"]


def test_a_new_file_gets_the_umask_mode(tmp_path):
    umask = os.umask(0o027)
    try:
        write_atomically(tmp_path / "new.py", NEW)
    finally:
        os.umask(umask)
    assert (tmp_path / "new.py").read_bytes() == NEW
    assert (tmp_path / "new.py").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("failing", ["fsync", "replace", "chmod"])
def test_a_failure_leaves_the_original_and_no_temporary_file(tmp_path, monkeypatch, failing):
    path = tmp_path / "m.py"
    path.write_bytes(OLD)
    monkeypatch.setattr(safe_files.os, failing, _full_disk)
    with pytest.raises(OSError) as raised:
        write_atomically(path, NEW)
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert path.read_bytes() == OLD
    assert os.listdir(tmp_path) == ["m.py"]


def test_a_failing_write_midway_leaves_the_original(tmp_path, monkeypatch):
    path = tmp_path / "m.py"
    path.write_bytes(OLD)
    real_fdopen = os.fdopen

    class HalfWritten:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            self.handle.write(data[: len(data) // 2])
            self.handle.flush()
            _full_disk()

    monkeypatch.setattr(safe_files.os, "fdopen", lambda fd, mode: HalfWritten(real_fdopen(fd, mode)))
    with pytest.raises(OSError):
        write_atomically(path, NEW)
    assert path.read_bytes() == OLD
    assert os.listdir(tmp_path) == ["m.py"]


def test_an_interrupt_leaves_the_original_and_goes_on_up(tmp_path, monkeypatch):
    path = tmp_path / "m.py"
    path.write_bytes(OLD)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(safe_files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(path, NEW)
    monkeypatch.undo()
    assert path.read_bytes() == OLD
    assert not [name for name in os.listdir(tmp_path) if name.endswith(TEMPORARY_SUFFIX)]


def test_a_symbolic_link_is_never_replaced_nor_followed(tmp_path):
    target = tmp_path / "target.py"
    target.write_bytes(OLD)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    with pytest.raises(OSError, match="not a regular file"):
        write_atomically(link, NEW)
    assert link.is_symlink() and target.read_bytes() == OLD
