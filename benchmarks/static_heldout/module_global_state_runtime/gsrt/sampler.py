"""Sampling over the per-row parameters kept in state._STATE (filled every step from pinned twins)."""
import torch

from . import config as C
from . import state as S

_noise = None


def sample(logits, bs, slots, prescaled=False):
    """Sample one token per row, scatter it to the rows' slots of _STATE["next_tokens"] and flag
    finished rows.

    ``prescaled`` logits come out of a replayed graph, which already divided them by the temperature.
    """
    global _noise
    if _noise is None:
        _noise = torch.empty(S.max_bs + 1, C.VOCAB, dtype=torch.float32, device=S.DEVICE)  # ok: FC107

    scale = S._STATE["logit_scale"][:bs]
    rows = scale != 1.0
    # only touch the rows that asked for a logit scale
    logits[rows] = logits[rows] * scale[rows].unsqueeze(1)  # expect: FC101

    ignore_eos = S._STATE["ignore_eos"][:bs]
    logits[ignore_eos, C.EOS_ID] = float("-inf")  # ok: FC101

    temperature = S._STATE["temperature"][:bs]
    if not prescaled:
        logits = logits / temperature.clamp(min=1e-5).unsqueeze(1)
    probs = torch.softmax(logits, dim=-1)
    race = probs / _noise[:bs].exponential_()
    tokens = torch.where(temperature == 0, logits.argmax(dim=-1), race.argmax(dim=-1))

    S._STATE["next_tokens"].index_copy_(0, slots[:bs], tokens)
    S._STATE["sampled"][:bs].copy_(tokens)
    hit_len = S.seq_lens[:bs] + 1 >= S._STATE["max_len"][:bs]
    S._STATE["finished"][:bs] |= (tokens == C.EOS_ID) | hit_len
    return tokens
