"""Small helpers shared by the router, the backend and the graph pool."""

from __future__ import annotations

import torch


def ids_summary(ids: torch.Tensor) -> str:
    return ",".join(str(i) for i in ids.tolist())  # expect: FC101


def fill_tail(buf: torch.Tensor, start: int, value: int) -> None:
    buf[start:].fill_(value)
