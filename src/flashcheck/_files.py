"""Every file flashcheck writes goes through here: atomic, never replacing anything but a regular file, honouring the
umask, durable (the directory is fsynced after the rename); and the lock that keeps two writers out of one run
directory. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import IO

from flashcheck.errors import InvalidArgument

__all__ = ["RunDirLock", "atomic_write_text", "check_output_path"]

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def _umask() -> int:
    """The process umask, read without changing it where the kernel reports it (os.umask is set-and-return)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_path(path: str | os.PathLike[str]) -> os.stat_result | None:
    """The path's current status (None when it does not exist); `InvalidArgument` when it is anything but a regular
    file: flashcheck never replaces a device, a FIFO, a symbolic link or a directory."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidArgument(f"{p}: cannot be written ({exc.strerror}): choose another path") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise InvalidArgument(f"{p} is {kind}: flashcheck only replaces regular files; choose another path")
    return st


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically: a reader (or a crash) never sees a half-written file. An existing file
    keeps its mode; a new one gets 0666 less the umask. `InvalidArgument` (one line, naming the path) when the path
    is not a regular file or cannot be written."""
    p = Path(path)
    st = check_output_path(p)
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
    tmp: str | None = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, p)
        tmp = None
        _fsync_dir(p.parent)
    except OSError as exc:
        raise InvalidArgument(f"{p}: cannot be written ({exc.strerror or exc}): choose a writable path") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class RunDirLock:
    """An exclusive lock on a run directory (``RUN_DIR/.lock``, held while a run writes it): a second `flashcheck
    fuzz` or `campaign` on the same directory gets a one-line error instead of racing the first. Released when the
    process ends, however it ends."""

    NAME = ".lock"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / self.NAME
        self._fh: IO[str] | None = None

    def acquire(self) -> RunDirLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no advisory locks on this platform
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = self.path.open("a+", encoding="utf-8")
        except OSError as exc:
            where = self.path.parent
            raise InvalidArgument(f"{where}: cannot be written ({exc.strerror}): choose another path") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise InvalidArgument(
                f"{self.path.parent} is in use by {holder}: wait for it to finish or choose another directory"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
