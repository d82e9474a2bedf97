"""LSE merge of the partial attention outputs computed by each host in phase 2."""

import flashinfer
import torch


def merge_all(outs: torch.Tensor, lses: torch.Tensor, valid: torch.Tensor):
    """outs: [hosts, tokens, heads, dim]; lses: [hosts, tokens, heads]; valid: [hosts, tokens].

    A host that holds no KV for a row contributes -inf, so its partial gets zero weight.
    """
    neg_inf = torch.full_like(lses, float("-inf"))
    lses = torch.where(valid.unsqueeze(-1), lses, neg_inf)  # ok: FC101
    v = outs.transpose(0, 1).contiguous()
    s = lses.transpose(0, 1).contiguous()
    return flashinfer.merge_states(v, s)
