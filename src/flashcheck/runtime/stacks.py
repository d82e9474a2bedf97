"""Python stacks as `Frame` tuples, and the rule that picks the user's line out of them (pure, no torch).

A stack is captured where an event is observed (inside a warning hook, a dispatch mode, a trace callback), so its
innermost frames belong to flashcheck, torch or the standard library; `user_frame` skips those to find the line that
the user wrote. The full stack is kept in findings so nothing is lost.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
from collections.abc import Sequence
from types import FrameType

from flashcheck.findings import Frame

__all__ = ["capture_stack", "is_internal_file", "stack_from", "user_frame", "with_source"]

_FLASHCHECK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB_DIRS = tuple(
    {os.path.abspath(p) for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p}
)
_MAX_DEPTH = 64


def _torch_dir() -> str | None:
    # Only a lookup: never import torch for this (it would break the torch-free import guarantee).
    mod = sys.modules.get("torch")
    f = getattr(mod, "__file__", None) if mod is not None else None
    return os.path.dirname(os.path.abspath(f)) if f else None


def is_internal_file(path: str) -> bool:
    """True for frames that are never the user's offending line: flashcheck, torch, the stdlib, frozen modules."""
    if path.startswith("<"):
        return True
    p = os.path.abspath(path)
    if p.startswith(_FLASHCHECK_DIR + os.sep):
        return True
    td = _torch_dir()
    if td is not None and p.startswith(td + os.sep):
        return True
    # site-packages live under the stdlib prefix on some layouts; they are user code (FlashInfer, the engine).
    return any(p.startswith(d + os.sep) for d in _STDLIB_DIRS) and "site-packages" not in p


def capture_stack(skip: int = 1, limit: int = _MAX_DEPTH) -> tuple[Frame, ...]:
    """The current Python stack, outermost first, innermost last, without the `skip` innermost frames.

    Source lines are not read here (hot: every observed event captures a stack); `with_source` adds them to the
    few stacks that become findings."""
    try:
        f = sys._getframe(skip)
    except ValueError:
        return ()
    return stack_from(f, limit)


def stack_from(frame: FrameType | None, limit: int = _MAX_DEPTH) -> tuple[Frame, ...]:
    """The stack from `frame` outwards, outermost first (`frame` innermost)."""
    f = frame
    frames: list[Frame] = []
    while f is not None and len(frames) < limit:
        code = f.f_code
        line = f.f_lineno or 0
        frames.append(Frame(code.co_filename, line, code.co_name))
        f = f.f_back
    frames.reverse()
    return tuple(frames)


def with_source(stack: Sequence[Frame]) -> tuple[Frame, ...]:
    """`stack` with each frame's source line filled in where it is missing and the file can be read."""
    out = []
    for fr in stack:
        code = fr.code or linecache.getline(fr.file, fr.line).strip()
        out.append(fr if code == fr.code else Frame(fr.file, fr.line, fr.function, code))
    return tuple(out)


def user_frame(stack: Sequence[Frame]) -> Frame | None:
    """The innermost frame that is not flashcheck, torch or the standard library (None if there is none)."""
    for fr in reversed(stack):
        if not is_internal_file(fr.file):
            return fr
    return None
