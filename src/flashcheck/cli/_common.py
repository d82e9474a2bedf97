"""Helpers shared by the subcommands, and the flags every subcommand spells the same way (one CLI grammar):
``--target``, ``--config`` (alias ``--target-config``), ``--time``/``--steps`` budgets, ``--device``, ``--out``
(aliases ``--output``, ``-o``) and ``--format`` (aliases ``md``, ``text``)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, TextIO

from flashcheck.errors import InvalidArgument

__all__ = ["Progress", "add_config", "add_out", "parse_json_object", "require_runtime"]

RUNTIME_HINT = "pip install 'flashcheck[torch]' (or 'flashcheck[gpu]' for FlashInfer)"


def require_runtime(command: str) -> None:
    """`EnvironmentUnavailable` unless torch can be imported: the runtime subcommands (fuzz, campaign, replay) need
    it; static, report and rules do not, and the core install does not bring it."""
    import importlib.util

    from flashcheck.errors import EnvironmentUnavailable

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise EnvironmentUnavailable(f"flashcheck {command} needs torch, which is not installed: {RUNTIME_HINT}")


def add_out(p: argparse.ArgumentParser | Any, help_text: str, *, metavar: str = "PATH") -> None:
    """``--out`` with its aliases ``--output`` and ``-o`` (dest ``out``)."""
    p.add_argument("--out", "--output", "-o", dest="out", metavar=metavar, default=None, help=help_text)


def add_config(p: argparse.ArgumentParser | Any) -> None:
    """``--config`` with its alias ``--target-config`` (dest ``config``): the target's constructor overrides."""
    p.add_argument(
        "--config",
        "--target-config",
        dest="config",
        metavar="JSON",
        default=None,
        help="target configuration as a JSON object of constructor arguments, e.g. '{\"buckets\": [1, 2, 4]}'",
    )


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """The JSON object given to `flag` (empty when not given); `InvalidArgument` naming the flag otherwise."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{flag} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidArgument(f"{flag} must be a JSON object of target constructor arguments")
    return value


def add_async_pressure(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--async-pressure-us US``: the same option in ``flashcheck fuzz``, ``flashcheck campaign`` and pytest."""
    p.add_argument(
        "--async-pressure-us",
        metavar="US",
        help="keep the GPU stream busy for US microseconds before each host-side preparation step (plan, "
        "prepare_replay), so host work overlaps the device as in an overlapped scheduler and races show as FC303 "
        "(default: off)",
    )


class Progress:
    """Progress of long work: a live line on a terminal, a plain line every `every` seconds otherwise."""

    def __init__(self, prefix: str, stream: TextIO, *, every: float = 30.0, live: bool | None = None) -> None:
        self.prefix = prefix
        self.stream = stream
        self.live = stream.isatty() if live is None else live
        self.every = 1.0 if self.live else every
        self.t0 = time.monotonic()
        self._last = self.t0

    def tick(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        line = f"{self.prefix}: {now - self.t0:.0f}s {text}"
        if self.live:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
