"""The summary cache of ``flashcheck static``: one entry per file content, so that a second run re-reads only the
files that changed (the incremental mode for pre-commit).

An entry is keyed by a hash of the file's bytes, its module name, whether it is a package's ``__init__.py``,
flashcheck's version, the analysis schema (`SCHEMA`), the Python version (whose parser made the tree) and the source
of the modules that build a summary (`SUMMARY_MODULES`), so an edited indexer never reads entries the old one wrote;
what it holds is opaque here (`flashcheck.verifier.frontend` writes and reads it). Entries are written atomically (a
temporary file in the same directory, then a rename). A missing, unreadable or corrupt entry is a miss and is
written again; a failure to write is silent (the run only loses the speed-up); a path that is not a regular file
(a directory, a link, a FIFO) is never replaced, and a cache directory that is not a directory disables the cache.
The directory holds pickles: it is trusted like the sources it sits next to, and only flashcheck writes there.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import stat
import sys
import tempfile
from pathlib import Path

import flashcheck

__all__ = ["CACHE_ENV", "DEFAULT_DIR", "SCHEMA", "SUMMARY_MODULES", "SummaryCache", "cache_key"]

DEFAULT_DIR = ".flashcheck_cache"
CACHE_ENV = "FLASHCHECK_STATIC_CACHE_DIR"  # the command line's default directory, when set
SCHEMA = 4  # raise whenever what an entry holds, or how it is built, changes
# The modules whose code makes a summary: their source is part of every key.
SUMMARY_MODULES = (
    "flashcheck.verifier.astutil",
    "flashcheck.verifier.cache",
    "flashcheck.verifier.frontend",
    "flashcheck.verifier.index",
    "flashcheck.verifier.indexer",
    "flashcheck.verifier.itemkeys",
    "flashcheck.verifier.module_idioms",
    "flashcheck.verifier.operator_idioms",
    "flashcheck.verifier.source",
)
_MAGIC = b"flashcheck-summary\n"
_TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This file is a cache directory tag created by flashcheck static.\n"
    b"# For information about cache directory tags see https://bford.info/cachedir/\n"
)


def cache_key(data: bytes, module: str, is_package: bool) -> str:
    """The key of a file whose bytes are `data`, read as module `module` (a package's ``__init__.py`` when
    `is_package`): what its summary depends on."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{_code()}\0{module}\0{is_package}\0".encode())
    h.update(data)
    return h.hexdigest()


@functools.cache
def _code() -> str:
    """The schema, the versions and a hash of the source of `SUMMARY_MODULES` (or, where one cannot be read,
    its name)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{SCHEMA}\0{flashcheck.__version__}\0{sys.version_info[0]}.{sys.version_info[1]}\0".encode())
    for name in SUMMARY_MODULES:
        spec = importlib.util.find_spec(name)
        try:
            h.update(Path(spec.origin).read_bytes() if spec is not None and spec.origin else name.encode())
        except OSError:
            h.update(name.encode())
    return h.hexdigest()


class SummaryCache:
    """Entries under ``<directory>/summaries/``; every method swallows file-system errors."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.root = Path(directory)
        self.dir = self.root / "summaries"
        self.enabled = True
        self._prepared = False

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / key

    def get(self, key: str) -> bytes | None:
        """The payload of entry `key`, or None when it is missing or not an entry (a corrupt payload is the
        reader's to detect; it calls `put` again)."""
        if not self.enabled:
            return None
        try:  # never follow a link, never block on a FIFO: only a regular file is an entry
            fd = os.open(self.path(key), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            with os.fdopen(fd, "rb") as f:
                fd = -1
                data = f.read()
        except OSError:
            return None
        finally:
            if fd >= 0:
                os.close(fd)
        if not data.startswith(_MAGIC):
            return None
        return data[len(_MAGIC) :]

    def put(self, key: str, payload: bytes) -> bool:
        """Write entry `key` atomically; False when it could not be written (nothing else happens)."""
        if not self.enabled or not self.prepare():
            return False
        target = self.path(key)
        try:
            try:
                mode = os.lstat(target).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None and not stat.S_ISREG(mode):
                return False  # never replace a directory, link or device that stands where an entry goes
            target.parent.mkdir(exist_ok=True)
            if not stat.S_ISDIR(os.lstat(target.parent).st_mode):
                return False  # nor write through a link where a directory of entries goes
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        except OSError:
            return False
        written = False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC)
                f.write(payload)
            os.replace(tmp, target)
            written = True
        except OSError:
            pass
        finally:  # also when interrupted: no temporary file is left behind
            if not written:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return written

    def prepare(self) -> bool:
        """Create the directory (with a CACHEDIR.TAG and a .gitignore) on the first write."""
        if self._prepared:
            return self.enabled
        self._prepared = True
        try:
            fresh = not self.root.exists()
            for d in (self.root, self.dir):
                d.mkdir(parents=True, exist_ok=True)
                if not stat.S_ISDIR(os.lstat(d).st_mode):
                    self.enabled = False  # a file or a link where the cache's directories go: never written through
                    return False
            if fresh:
                for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", b"# created by flashcheck static\n*\n")):
                    p = self.root / name
                    if not p.exists():
                        p.write_bytes(text)
        except OSError:
            self.enabled = False
        return self.enabled
