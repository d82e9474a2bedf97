"""EAGLE-2 dynamic draft trees: every level expands the top-k children of the best nodes; the tree kept for
verification is the `total_tokens` candidates with the highest path score, so its shape changes every step."""

from __future__ import annotations

from typing import List, NamedTuple, Tuple

import numpy as np
import torch


class DynamicTree(NamedTuple):
    tokens: torch.Tensor  # [bs, n] draft tokens, parents before children
    parents: torch.Tensor  # [bs, n] index of the parent node in the tree, -1 under the root
    depth: torch.Tensor  # [bs, n] 1 + number of ancestors
    mask: torch.Tensor  # [bs, n, n] node i may attend to node j
    max_depth: int


def _ancestor_mask(par: torch.Tensor, levels: int) -> Tuple[torch.Tensor, torch.Tensor]:
    bs, n = par.shape
    eye = torch.eye(n, dtype=torch.bool, device=par.device).expand(bs, n, n)
    mask, depth, cur = eye.clone(), torch.ones_like(par), par
    for _ in range(levels):
        valid = cur >= 0
        mask |= valid[..., None] & eye.gather(1, cur.clamp(min=0)[..., None].expand(bs, n, n))
        depth += valid.long()
        cur = torch.where(valid, par.gather(1, cur.clamp(min=0)), cur)
    return mask, depth


def build_dynamic_tree(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, total_tokens: int,
                       levels: int) -> DynamicTree:
    """scores / tokens / parents: [bs, m] candidates of all levels; parents index the candidate pool."""
    assert total_tokens <= scores.shape[1], "tree budget larger than the candidate pool"  # expect: FC109
    keep = scores.topk(total_tokens, dim=-1).indices.sort(dim=-1).values
    remap = torch.full_like(parents, -1)
    remap.scatter_(1, keep, torch.arange(total_tokens, device=keep.device).expand_as(keep))
    par = parents.gather(1, keep)
    par = torch.where(par >= 0, remap.gather(1, par.clamp(min=0)), par)
    mask, depth = _ancestor_mask(par, levels)
    max_depth = int(depth.max())  # expect: FC101
    return DynamicTree(tokens.gather(1, keep), par, depth, mask, max_depth)


def pack_tree_mask(mask: torch.Tensor, prefix_lens: List[int]) -> Tuple[torch.Tensor, np.ndarray]:
    """Bit-pack each request's [n, prefix + n] mask (prefix columns visible) the way FlashInfer reads it."""
    n = mask.shape[1]
    weights = 1 << torch.arange(8, dtype=torch.uint8, device=mask.device)
    segs = []
    for i, p in enumerate(prefix_lens):
        full = torch.cat([mask.new_ones(n, p), mask[i]], dim=1).flatten().to(torch.uint8)
        full = torch.nn.functional.pad(full, (0, (-full.numel()) % 8)).view(-1, 8)
        segs.append((full * weights).sum(-1, dtype=torch.uint8))
    nbytes = np.array([(n * (p + n) + 7) // 8 for p in prefix_lens], dtype=np.int64)
    packed = torch.cat(segs)
    if packed.numel() != int(nbytes.sum()):  # ok: FC101
        raise RuntimeError(f"packed mask has {packed.numel()} bytes, offsets say {int(nbytes.sum())}")
    return packed, np.concatenate([[0], np.cumsum(nbytes)])
