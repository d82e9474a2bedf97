"""T5 relative position buckets and bias tables."""

import math

import torch
from torch import nn

from .constants import MAX_DISTANCE, NUM_BUCKETS


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool = True,
                             num_buckets: int = NUM_BUCKETS, max_distance: int = MAX_DISTANCE) -> torch.Tensor:
    assert num_buckets % 2 == 0 and max_distance > num_buckets, "bad bucket layout"  # expect: FC109
    ret = torch.zeros_like(relative_position)
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = torch.clamp(n, min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return ret + torch.where(is_small, n, large)


class RelativeBiasTable(nn.Module):
    def __init__(self, num_heads: int, bidirectional: bool, num_buckets: int = NUM_BUCKETS,
                 max_distance: int = MAX_DISTANCE):
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.emb = nn.Embedding(num_buckets, num_heads)

    def bias(self, q_len: int, k_len: int, device) -> torch.Tensor:
        ctx = torch.arange(q_len, device=device)[:, None]
        mem = torch.arange(k_len, device=device)[None, :]
        buckets = relative_position_bucket(mem - ctx, self.bidirectional, self.num_buckets, self.max_distance)
        return self.emb(buckets).permute(2, 0, 1).unsqueeze(0)          # [1, H, q, k]

    def encoder_bias(self, lengths: torch.Tensor) -> torch.Tensor:
        """Bias of a padded encoder batch, padding keys masked."""
        q_len = int(lengths.max())  # expect: FC101
        b = self.bias(q_len, q_len, lengths.device)
        pad = torch.arange(q_len, device=lengths.device)[None, :] >= lengths[:, None]
        return b.masked_fill(pad.unsqueeze(1).unsqueeze(1), float("-inf"))

    def decode_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """Bias of the last `max_distance` keys for each decode query; keys before position 0 masked."""
        rel = torch.arange(-(self.max_distance - 1), 1, device=positions.device)
        rows = self.emb(relative_position_bucket(rel, False, self.num_buckets, self.max_distance)).t()  # [H, R]
        keys = positions[:, None] + rel[None, :]
        out = rows.unsqueeze(0).expand(positions.shape[0], -1, -1).clone()
        return out.masked_fill((keys < 0).unsqueeze(1), float("-inf"))
