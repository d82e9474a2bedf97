import contextlib
from typing import Iterator

import torch


class PadOnExit:
    __slots__ = ("buf", "n", "bs")

    def __init__(self, buf: torch.Tensor, n: int, bs: int):
        assert n <= bs, "live rows exceed the bucket"  # expect: FC109
        self.buf = buf
        self.n = n
        self.bs = bs

    def __enter__(self) -> torch.Tensor:
        return self.buf[: self.n]

    def __exit__(self, *exc) -> bool:
        self.buf[self.n : self.bs].fill_(1)  # expect: FC104
        return False


class StageOnExit:
    __slots__ = ("dst", "staging", "n", "entered")

    def __init__(self, dst: torch.Tensor, staging: torch.Tensor, n: int):
        self.dst = dst
        self.staging = staging
        self.n = n
        self.entered = False

    def __enter__(self) -> torch.Tensor:
        self.entered = True
        return self.staging[: self.n]

    def __exit__(self, exc_type, exc, tb) -> bool:
        assert self.entered, "exit without enter"  # ok: FC109
        if exc_type is None:
            self.dst[: self.n].copy_(self.staging[: self.n], non_blocking=True)  # ok: FC104
        return False


@contextlib.contextmanager
def reset_after(buf: torch.Tensor) -> Iterator[torch.Tensor]:
    try:
        yield buf
    finally:
        buf.zero_()


def pad_from(buf: torch.Tensor, row: int) -> None:
    buf[row:].fill_(1)
