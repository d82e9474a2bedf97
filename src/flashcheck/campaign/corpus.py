"""The campaign corpus: scenarios worth keeping, in a Hypothesis example database shared by every worker and node.

We reuse Hypothesis' databases instead of a home-made protocol: `DirectoryBasedExampleDatabase` on a local or
shared directory (NFS, Lustre: every entry is its own file written atomically), or ``RedisExampleDatabase`` for
``redis://`` URLs. One key per target holds the canonical JSON of the smallest reproducer of every finding; a
campaign replays the entries it has not run yet when it starts and whenever it polls the database, so a finding
made on one node is re-checked on every other.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from flashcheck.errors import InvalidArgument
from flashcheck.scenario import Scenario

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase

__all__ = ["Corpus", "open_database"]

KEY_PREFIX = b"flashcheck.campaign.v1:"


def open_database(location: str | None, run_dir: Path) -> ExampleDatabase:
    """The example database at `location` (a directory or ``redis://host:port/db``); RUN_DIR/corpus by default."""
    if location and location.startswith(("redis://", "rediss://", "unix://")):
        try:
            redis = importlib.import_module("redis")
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError as exc:
            raise InvalidArgument(f"--corpus {location} needs the redis package: pip install redis ({exc})") from exc
        try:
            return RedisExampleDatabase(redis.Redis.from_url(location))
        except Exception as exc:
            raise InvalidArgument(f"--corpus {location}: cannot open the Redis database: {exc}") from exc
    from hypothesis.database import DirectoryBasedExampleDatabase

    path = Path(location) if location else run_dir / "corpus"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"  # per process: nodes sharing the corpus probe at once
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InvalidArgument(f"corpus directory {path} is not writable: {exc}; pass another --corpus") from exc
    return DirectoryBasedExampleDatabase(str(path))


def _key(target: str) -> bytes:
    return KEY_PREFIX + target.encode()


def entry_id(value: bytes) -> str:
    return hashlib.sha1(value).hexdigest()[:16]


class Corpus:
    """Scenarios per target in an example database (values are canonical scenario JSON)."""

    def __init__(self, db: ExampleDatabase) -> None:
        self.db = db

    @staticmethod
    def encode(scenario: Scenario) -> bytes:
        return json.dumps(scenario.to_dict(), sort_keys=True, separators=(",", ":"), default=str).encode()

    def save(self, scenario: Scenario) -> str:
        value = self.encode(scenario)
        self.db.save(_key(scenario.target), value)
        return entry_id(value)

    def delete(self, scenario: Scenario) -> None:
        self.db.delete(_key(scenario.target), self.encode(scenario))

    def entries(self, target: str) -> Iterator[tuple[str, Scenario]]:
        """(entry id, scenario) for every readable entry of `target`; unreadable entries are skipped."""
        for value in self.db.fetch(_key(target)):
            try:
                yield entry_id(value), Scenario.from_dict(json.loads(value))
            except (ValueError, InvalidArgument):
                continue
