"""The 2-D Jacobi window: W rows of (N-1) guessed tokens per request, shifted every step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ljserve.config import LookaheadConfig


@triton.jit
def shift_window_kernel(win_ptr, guess_ptr, row_stride, W: tl.constexpr, N1: tl.constexpr):
    assert N1 > 0  # ok: FC109
    pid = tl.program_id(0)
    offs = tl.arange(0, N1)
    base = win_ptr + pid * row_stride
    for w in range(W - 1):
        src = tl.load(base + (w + 1) * N1 + offs)
        tl.store(base + w * N1 + offs, src)
    new = tl.load(guess_ptr + pid * N1 + offs)
    tl.store(base + (W - 1) * N1 + offs, new)


class JacobiWindow:
    def __init__(self, cfg: LookaheadConfig, device: torch.device):
        self.W = cfg.window_size
        self.N1 = cfg.ngram_size - 1
        self.device = device
        self.tokens = torch.zeros((cfg.max_batch_size, self.W, self.N1), dtype=torch.int64, device=device)

    def seed_row(self, row: int, prompt_tail: torch.Tensor) -> None:
        # a fresh request starts its trajectory from random prompt tokens (the paper's initialisation)
        idx = torch.randint(0, prompt_tail.numel(), (self.W, self.N1), device=self.device)
        self.tokens[row] = prompt_tail.to(self.device)[idx]

    def shift(self, bs: int, new_guesses: torch.Tensor) -> None:
        shift_window_kernel[(bs,)](self.tokens, new_guesses, self.tokens.stride(0), W=self.W, N1=self.N1)

    def reseed(self, bs: int, accepted_tail: torch.Tensor) -> None:
        # after a full-length acceptance the trajectory is stale: restart every row from the accepted n-gram
        seed = accepted_tail[:, None, :].expand(bs, self.W, self.N1)
        self.tokens = torch.cat([seed, self.tokens[bs:]], dim=0)  # expect: FC107

    def keep_rows(self, keep: torch.Tensor) -> None:
        n = keep.shape[0]
        self.tokens[:n].copy_(self.tokens[keep])

    def as_inputs(self, bs: int) -> torch.Tensor:
        return self.tokens[:bs].reshape(bs, self.W * self.N1)
