"""Atomic file output: every file CELS writes appears complete or not at all.

Data goes to a temporary file in the target's directory, is flushed and fsync'ed, and is
renamed over the target with :func:`os.replace` only when the ``with`` block succeeds.  On
any exception the temporary file is removed and an existing target is left untouched.  A
command that calls :func:`raise_on_termination` turns SIGTERM and SIGHUP into
:class:`Terminated`, so that a signal unwinds the same way (issue 13 item 4).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


HELD_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
"""Held back while a temporary output is created and registered (delivered right after)."""


@contextmanager
def _signals_held() -> Iterator[None]:
    """Delay SIGTERM, SIGHUP and SIGINT to this thread for the block (POSIX threads' signal mask)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    mode: str = "w",
    encoding: str | None = "utf-8",
    newline: str | None = None,
    file_mode: int | None = None,
    replace: bool = True,
) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; rename it to ``path`` on success.

    ``mode`` is ``"w"`` (text, with ``encoding`` and ``newline``) or ``"wb"`` (binary);
    ``file_mode`` the permissions (default: the replaced file's, else 0o666 & ~umask).
    ``replace=False`` publishes only if ``path`` does not exist at that moment (a hard link,
    atomic): FileExistsError otherwise, the temporary file removed and ``path`` untouched.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', not {mode!r}")
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    tmp_name = None
    try:
        with _signals_held():  # a signal between the file's creation and its name's assignment would leave it behind
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
            _OPEN_TEMPORARIES.add(tmp_name)
        os.chmod(tmp_name, _final_mode(target) if file_mode is None else file_mode)
        if mode == "wb":
            fh: IO[Any] = os.fdopen(fd, "wb")
        else:
            fh = os.fdopen(fd, "w", encoding=encoding, newline=newline)
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp_name, target)
        else:
            try:
                os.link(tmp_name, target)
            except FileExistsError:
                raise FileExistsError(f"{target} exists: another run wrote it meanwhile (--force replaces it)") from None
            os.unlink(tmp_name)
        _fsync_directory(directory)
    except BaseException:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except FileNotFoundError:
                pass
        raise
    finally:
        _OPEN_TEMPORARIES.discard(tmp_name)


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread: every ``with`` block unwinds, so open
    :func:`atomic_write` files are removed and started node processes are stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
TERMINATION_GRACE = 15.0
"""Seconds a signalled command may take to unwind (a started node takes up to 10 s to stop);
then its open temporary files are removed and it exits regardless."""
_OPEN_TEMPORARIES: set[str] = set()


def raise_on_termination() -> None:
    """Make SIGTERM and SIGHUP raise :class:`Terminated` and SIGINT KeyboardInterrupt in the
    main thread; a no-op when called from another thread.

    An exception raised at an arbitrary point can leave a library's lock held (a gRPC
    channel's close then waits forever), so each signal also arms a timer: after
    TERMINATION_GRACE seconds the open temporary files are removed and the process exits
    with 128 + the signal's number."""
    if threading.current_thread() is not threading.main_thread():
        return

    def terminated(signum: int, _frame: object) -> None:
        timer = threading.Timer(TERMINATION_GRACE, _exit_now, args=(signum,))
        timer.daemon = True
        timer.start()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, terminated)


def _exit_now(signum: int) -> None:
    for name in list(_OPEN_TEMPORARIES):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
    os._exit(128 + signum)


def _fsync_directory(directory: Path) -> None:
    """The rename itself made durable (a crash right after cannot bring the old file back)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _final_mode(target: Path) -> int:
    """The replaced file's mode, else what ``open`` would give a new file (0o666 & ~umask)."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_json(path: str | os.PathLike[str], obj: Any, file_mode: int | None = None) -> None:
    """Write ``obj`` as indented JSON (with a final newline) atomically."""
    with atomic_write(path, file_mode=file_mode) as fh:
        json.dump(obj, fh, indent=2, sort_keys=False)
        fh.write("\n")


def check_output_paths(
    outputs: dict[str, str | os.PathLike[str] | None], inputs: tuple[str | os.PathLike[str], ...] = (), force: bool = False
) -> None:
    """Refuse, before any work starts, output paths that cannot or must not be written.

    ``outputs`` maps a label (the flag, e.g. ``"--out"``) to the user's path (None: not asked
    for).  Raises ValueError naming the user's path when a path is a directory, exists (unless
    ``force``: an earlier release is not lost by a second run), its directory does not exist or
    is not writable, two outputs are the same file, or an output is one of ``inputs`` --
    compared by device and inode (symlinks and hard links alike) when the file exists, else by
    the resolved path."""
    given = {label: Path(path) for label, path in outputs.items() if path is not None}
    for label, path in given.items():
        if path.is_dir():
            raise ValueError(f"{label} {path} is a directory; give a file name")
        parent = path.resolve().parent
        if not parent.is_dir():
            raise ValueError(f"{label} {path}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{label} {path}: directory {parent} is not writable")
        for source in inputs:
            if same_file(path, Path(source)):
                raise ValueError(f"{label} {path} is the input {source}: refusing to overwrite the input log")
        if path.exists() and not force:
            raise ValueError(f"{label} {path} exists: give --force to replace it, or another path")
    labels = list(given)
    for i, first in enumerate(labels):
        for second in labels[i + 1 :]:
            if same_file(given[first], given[second]):
                raise ValueError(f"{first} {given[first]} and {second} {given[second]} are the same file")


def same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` name one file: the same (st_dev, st_ino) if both exist (symlinks, hard
    links), else the same resolved path."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except FileNotFoundError:
        return a.resolve() == b.resolve()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
