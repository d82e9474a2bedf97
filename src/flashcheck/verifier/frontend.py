"""The per-file front end of ``flashcheck static``: read, parse and index every file, through the summary cache.

A file's *summary* is what the whole-project model needs of it: its `SourceFile` (lines, suppressions, parse error)
and its `ModuleIndex` (definitions, imports, and per function the calls, stores, returns, asserts and branch tests
with their expressions). It depends only on the file's bytes, module name and whether it is a package's
``__init__.py`` (`cache_key`), so the cache keeps one entry per file content and a run re-parses only the files
that changed. A summary loaded from the cache is the one parsing would give (a pickle of it), so findings do not
depend on the cache; an entry that cannot be loaded is made again and rewritten.

Parsing happens in the process that holds the model (with ``jobs`` above 1, a forked child of the caller:
`flashcheck.verifier.engine`), because the model holds the trees: a tree sent from another process costs about as
much to unpickle as to parse (``docs/design.md``). Writing new entries (pickling, which costs about as much again)
is what other processes do: with ``jobs`` above 1, batches of new summaries are handed to forked writer processes
(at most ``jobs - 1`` at a time) that pickle and write them while the parsing process carries on;
`Summaries.finish` waits for them. With ``jobs`` 1, where ``fork`` is missing, or when other threads run, the
parsing process writes them itself.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
from collections.abc import Sequence
from pathlib import Path

from flashcheck.verifier.cache import SummaryCache, cache_key
from flashcheck.verifier.index import ModuleIndex
from flashcheck.verifier.indexer import index_module
from flashcheck.verifier.source import SourceFile, module_name, parse_source, relpath

__all__ = ["Summaries", "Summary", "default_jobs", "summarise_files"]

Summary = tuple[SourceFile, ModuleIndex | None]
_BATCH = 96  # new summaries per writer process


def default_jobs() -> int:
    """Processes by default: one per CPU this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


class Summaries:
    """The summaries of a run's files, in order, with the writers of new cache entries still at work."""

    def __init__(self, summaries: list[Summary], writers: list[int]) -> None:
        self.summaries = summaries
        self.loaded = 0  # how many came from the cache
        self._writers = writers

    def finish(self) -> None:
        """Wait for the writer processes (the cache is complete afterwards)."""
        while self._writers:
            _reap(self._writers.pop())


def summarise_files(
    files: Sequence[Path], root: Path, *, jobs: int = 1, cache: SummaryCache | None = None
) -> Summaries:
    """The summary of each of `files` (in order): loaded from `cache` where it has one, else made here and
    written to `cache` (by up to ``jobs - 1`` writer processes)."""
    out: list[Summary] = []
    writers: list[int] = []
    pending: list[tuple[str, Summary]] = []
    loaded = 0
    forking = jobs > 1 and hasattr(os, "fork") and threading.active_count() == 1
    for path in files:
        rel, mod = relpath(path, root), module_name(path, root)
        try:
            data = path.read_bytes()
        except OSError as exc:
            out.append((SourceFile(path, rel, mod, "", None, error=f"cannot read: {exc}"), None))
            continue
        key = cache_key(data, mod, path.name == "__init__.py") if cache is not None else ""
        blob = cache.get(key) if cache is not None else None
        summary = _loads(blob, path, rel, mod) if blob is not None else None
        if summary is not None:
            loaded += 1
        else:  # no cache, a new file, or an entry that does not load: parse it, and (re)write the entry
            sf = parse_source(path, rel, mod, data)
            summary = (sf, index_module(sf))
            sf.text = ""  # `lines` holds it
            if cache is not None:
                pending.append((key, summary))
        out.append(summary)
        if len(pending) >= _BATCH and cache is not None and _write(cache, pending, writers, jobs - 1 if forking else 0):
            pending = []
    if cache is not None and pending:
        _write(cache, pending, writers, jobs - 1 if forking else 0, last=True)
    result = Summaries(out, writers)
    result.loaded = loaded
    return result


def _write(
    cache: SummaryCache, batch: list[tuple[str, Summary]], writers: list[int], processes: int, *, last: bool = False
) -> bool:
    """Write `batch` to `cache` in a forked writer when `processes` allows one, else here; False (nothing done)
    when every writer is busy: the batch grows until one is free, or until the `last` batch, which waits."""
    if processes > 0 and cache.prepare():
        writers[:] = [pid for pid in writers if not _done(pid)]
        if len(writers) >= processes:
            if not last:
                return False
            _reap(writers.pop(0))
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid == 0:  # the writer: pickle and write, then leave without running the parent's exit handlers
            code = 1
            try:
                _put_all(cache, batch)
                code = 0
            finally:
                os._exit(code)
        if pid > 0:
            writers.append(pid)
            return True
    _put_all(cache, batch)
    return True


def _put_all(cache: SummaryCache, batch: list[tuple[str, Summary]]) -> None:
    for key, summary in batch:
        blob = _dumps(summary)
        if blob is not None:
            cache.put(key, blob)


def _done(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:  # pragma: no cover - reaped elsewhere
        return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # reaped elsewhere
        os.waitpid(pid, 0)


def _dumps(summary: Summary) -> bytes | None:
    """The cache payload of a summary (its tree included); None when it cannot be pickled (an expression nested
    deeper than the pickler recurses), and then the file is parsed again on the next run."""
    try:
        return pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL)
    except (RecursionError, pickle.PicklingError, TypeError, ValueError):
        return None


def _loads(blob: bytes, path: Path, rel: str, mod: str) -> Summary | None:
    """A cached summary, placed at `path` (an entry made for the same bytes and module at another path is valid);
    None when the payload is not one."""
    try:
        loaded = pickle.loads(blob)
    except Exception:  # a corrupt entry is a miss, whatever unpickling raised
        return None
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], SourceFile)):
        return None
    sf, mi = loaded
    if not (mi is None or isinstance(mi, ModuleIndex)) or sf.module != mod:
        return None
    sf.path, sf.relpath = path, rel
    return sf, mi
