"""Progress on long runs: a tqdm bar on stderr when stderr is a terminal, nothing otherwise.

Nothing is drawn (tqdm not even imported) off a terminal, with ``TERM=dumb`` or ``quiet=True``, so
output meant for a program is never touched.  Colour follows ``NO_COLOR`` (https://no-color.org),
for the bar and for :func:`paint`; :func:`fit_width` wraps a report to the terminal's width.  Text
the checked code prints while a bar is up goes through :attr:`Progress.out`, which keeps the bar
whole.  Nothing here imports torch."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from recheck.output.text import ansi

__all__ = ["Progress", "colour_enabled", "fit_width", "paint", "progress", "shows_progress", "terminal_report",
           "terminal_width"]

#: Seconds between redraws of a bar that has no total (so its clock keeps moving).
_TICK = 0.5
#: Seconds at least between two redraws as the bar advances (tqdm's mininterval).
_MIN_INTERVAL = 0.1
#: The look of a bar without a total: what runs and for how long.
_UNCOUNTED = "{desc}: {elapsed}{postfix}"


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def colour_enabled(stream: IO[str] | None = None) -> bool:
    """Colour for ``stream`` (default stdout): a terminal, ``NO_COLOR`` unset or empty, not TERM=dumb."""
    stream = sys.stdout if stream is None else stream
    return (_is_terminal(stream) and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb")


def terminal_width(stream: IO[str] | None = None) -> int | None:
    """The width of the terminal ``stream`` (default stdout) is on (``COLUMNS`` first); None off a terminal."""
    stream = sys.stdout if stream is None else stream
    return shutil.get_terminal_size().columns if _is_terminal(stream) else None


def terminal_report(report: Any, *, verbose: bool, stream: IO[str] | None) -> str:
    """A report as text for ``stream`` (the one renderer, ``output.text.format_report``): on a
    terminal painted (unless ``NO_COLOR``) and wrapped to its width; elsewhere, or with no
    stream, plain and as rendered."""
    from recheck.output.text import format_report

    text = format_report(report, verbose=verbose, colour=stream is not None and colour_enabled(stream))
    return fit_width(text, terminal_width(stream) if stream is not None else None)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fit_width(text: str, width: int | None) -> str:
    """``text`` with each line longer than ``width`` wrapped at spaces, its continuation lines
    indented two more than the line (colour codes take no width; a word longer than the line
    stays whole).  ``width`` None: ``text`` as it is."""
    if not width:
        return text
    lines = []
    for line in text.split("\n"):
        if len(_ANSI.sub("", line)) <= width:
            lines.append(line)
            continue
        indent = len(line) - len(line.lstrip(" "))
        prefix, rest = line[:indent], " " * (indent + 2)
        words: list[str] = []
        used = indent
        for word in line[indent:].split(" "):
            size = len(_ANSI.sub("", word))
            if words and used + 1 + size > width:
                lines.append(prefix + " ".join(words))
                prefix, words, used = rest, [], len(rest)
            used += size + (1 if words else 0)
            words.append(word)
        lines.append(prefix + " ".join(words))
    return "\n".join(lines)


def paint(text: str, colour: str, stream: IO[str] | None = None) -> str:
    """``text`` in ``colour`` (red, green, yellow, bold, dim) when ``stream`` shows colour; else as is."""
    return ansi(text, colour, bool(text) and colour_enabled(stream))


def shows_progress(quiet: bool = False, stream: IO[str] | None = None) -> bool:
    """Whether a bar would be drawn on ``stream`` (default stderr)."""
    stream = sys.stderr if stream is None else stream
    if quiet or not _is_terminal(stream) or os.environ.get("TERM") == "dumb":
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:  # a partial install: run without a bar
        return False
    return True


class _Through:
    """A text stream that writes whole lines above the bar (tqdm.write) and keeps the bar drawn."""

    def __init__(self, bar: Any, stream: IO[str]) -> None:
        self._bar, self._stream, self._pending = bar, stream, ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            lines, _, self._pending = self._pending.rpartition("\n")
            self._bar.write(lines, file=self._stream)
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._bar.write(self._pending, file=self._stream)
            self._pending = ""

    def isatty(self) -> bool:
        return _is_terminal(self._stream)


class Progress:
    """What a running command tells its bar; every method does nothing when no bar is drawn."""

    def __init__(self, bar: Any = None, stream: IO[str] | None = None) -> None:
        self._bar = bar
        self._stream = sys.stderr if stream is None else stream
        self.out: IO[str] = _Through(bar, self._stream) if bar is not None else self._stream  # type: ignore[assignment]

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def advance(self, n: int = 1) -> None:
        """``n`` more items done."""
        if self._bar is not None:
            self._bar.update(n)

    def count(self, done: int, total: int | None) -> None:
        """``done`` of ``total`` items (the total may grow as work is found): a callback for engines."""
        if self._bar is not None:
            if total is not None and total != self._bar.total:
                self._bar.total = total
                self._bar.bar_format = None  # a bar begun without a total becomes a counted one
            self._bar.update(done - self._bar.n)

    def describe(self, text: str) -> None:
        """What runs now, shown after the bar's label."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    @contextmanager
    def redirected(self) -> Iterator[None]:
        """The block's stdout goes to stderr, above the bar while one is drawn (stderr too then).

        For running the user's code: its prints stay off stdout, which holds the report
        (or JSON), and neither its prints nor its warnings break the bar's line.
        """
        with contextlib.redirect_stdout(self.out):
            if self._bar is None:
                yield
                return
            with contextlib.redirect_stderr(self.out):
                yield


@contextmanager
def progress(label: str, total: int | None = None, *, unit: str = "it", quiet: bool = False,
             stream: IO[str] | None = None) -> Iterator[Progress]:
    """A :class:`Progress` for the ``with`` block; the bar is cleared when the block ends."""
    stream = sys.stderr if stream is None else stream
    if not shows_progress(quiet, stream):
        yield Progress(None, stream)
        return
    from tqdm import tqdm

    counted = total is not None
    bar = tqdm(total=total, desc=label, unit=f" {unit}", file=stream, leave=False, dynamic_ncols=True,
               colour=None if os.environ.get("NO_COLOR") else "green",
               bar_format=None if counted else _UNCOUNTED, mininterval=_MIN_INTERVAL)
    stop = threading.Event()
    ticker = None
    if not counted:  # nothing advances it: keep its clock moving
        ticker = threading.Thread(target=_tick, args=(bar, stop), name="recheck-progress", daemon=True)
        ticker.start()
    handle = Progress(bar, stream)
    try:
        yield handle
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
        handle.out.flush()
        bar.close()


def _tick(bar: Any, stop: threading.Event) -> None:
    while not stop.wait(_TICK):
        bar.refresh()
