from __future__ import annotations

import contextlib
from typing import Iterator, List

import torch


@contextlib.contextmanager
def nvtx_range(msg: str) -> Iterator[None]:
    torch.cuda.nvtx.range_push(msg)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


class TraceRange:
    """Nested named ranges kept on the host for a per-request timeline."""

    def __init__(self) -> None:
        self.depth = 0
        self.stack: List[str] = []

    def _check_depth(self) -> None:
        assert self.depth >= 0, "unbalanced trace ranges"  # ok: FC109

    def push(self, name: str) -> None:
        self.stack.append(name)
        self.depth += 1
        torch.cuda.nvtx.range_push(name)

    def pop(self) -> str:
        self.depth -= 1
        self._check_depth()
        torch.cuda.nvtx.range_pop()
        return self.stack.pop()
