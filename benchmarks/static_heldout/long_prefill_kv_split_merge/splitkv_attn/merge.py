"""Merging partial attention states by their log-sum-exp."""

import flashinfer
import torch


@torch.jit.script
def lse_weights(lse_a: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    assert lse_a.shape == lse_b.shape  # ok: FC109
    m = torch.maximum(lse_a, lse_b)
    ea = torch.exp2(lse_a - m)
    return ea / (ea + torch.exp2(lse_b - m))


def merge_partials(outs, lses):
    v, s = outs[0], lses[0]
    for v_i, s_i in zip(outs[1:], lses[1:]):
        v, s = flashinfer.merge_state(v, s, v_i, s_i)
    return v, s
