"""Per-request seeded sampling.

Each row draws its Gumbel noise from Philox keyed by the request's seed and its own step counter, so the token a
request samples does not depend on its row or on the batch it landed in. The kernel is graph-safe: seeds and
steps are device inputs of the captured decode graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bisrv.forward_batch import ForwardBatch
from bisrv.layers.invariant_ops import log_softmax_invariant


@triton.jit
def _gumbel_argmax_kernel(
    logp_ptr, seeds_ptr, steps_ptr, temps_ptr, out_ptr, vocab, stride, BLOCK: tl.constexpr
):
    assert BLOCK % 128 == 0  # ok: FC109
    row = tl.program_id(0)
    seed = tl.load(seeds_ptr + row)
    step = tl.load(steps_ptr + row)
    temp = tl.load(temps_ptr + row)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        lp = tl.load(logp_ptr + row * stride + cols, mask=mask, other=float("-inf"))
        u = tl.rand(seed, step * vocab + cols)
        g = -tl.log(-tl.log(u + 1e-20) + 1e-20)
        v = tl.where(mask, lp / temp + g, float("-inf"))
        take = v > best_val
        best_val = tl.where(take, v, best_val)
        best_idx = tl.where(take, cols.to(tl.int64), best_idx)
    winner = tl.argmax(best_val, axis=0)
    tl.store(out_ptr + row, tl.sum(tl.where(tl.arange(0, BLOCK) == winner, best_idx, 0), axis=0))


class SeededSampler:
    def __init__(self, vocab_size: int, backend: str = "triton"):
        self.vocab_size = vocab_size
        self._backend = backend

    def sample(self, logits: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        assert logits.dim() == 2, "sampler expects [rows, vocab] logits"  # expect: FC109
        rows = logits.shape[0]
        if (fb.seeds[:rows] < 0).any():  # expect: FC101
            raise ValueError("negative seeds must be resolved by the scheduler")
        logp = log_softmax_invariant(logits)
        temps = torch.where(fb.temperatures[:rows] > 0, fb.temperatures[:rows], 1.0)  # ok: FC101
        greedy = fb.temperatures[:rows] <= 0
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
        _gumbel_argmax_kernel[(rows,)](
            logp, fb.seeds, fb.sampling_steps, temps, out, self.vocab_size, logp.stride(0), BLOCK=1024
        )
        return torch.where(greedy, logp.argmax(dim=-1), out)
