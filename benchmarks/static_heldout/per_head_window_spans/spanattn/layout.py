"""Head permutation between the checkpoint order and the group order.

The span search picked kv heads by quality, so the heads of one group are not contiguous in
the projection weights: q/k/v are permuted once per layer, split per group, attended, and the
concatenated outputs are permuted back before ``o_proj``."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from spanattn.spans import HeadGroup


class HeadGroupLayout:
    def __init__(self, groups: Sequence[HeadGroup], num_qo_heads: int, num_kv_heads: int, device: torch.device):
        assert sum(g.num_kv_heads for g in groups) == num_kv_heads, "head groups must cover every kv head"  # expect: FC109
        self.groups: Tuple[HeadGroup, ...] = tuple(groups)
        self.num_groups = len(self.groups)
        ratio = num_qo_heads // num_kv_heads
        kv_perm = [h for g in self.groups for h in g.kv_heads]
        q_perm = [h * ratio + r for h in kv_perm for r in range(ratio)]
        self.kv_head_counts: List[int] = [g.num_kv_heads for g in self.groups]
        self.q_head_counts: List[int] = [c * ratio for c in self.kv_head_counts]
        self.kv_perm_dev = torch.tensor(kv_perm, dtype=torch.int64, device=device)
        self.q_perm_dev = torch.tensor(q_perm, dtype=torch.int64, device=device)
        self.q_inv_perm_dev = torch.argsort(self.q_perm_dev)
        self.kv_group_of_head_dev = torch.tensor(
            [gi for gi, g in enumerate(self.groups) for _ in g.kv_heads], dtype=torch.int64, device=device
        )

    def split_q(self, q: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        qp = q.index_select(1, self.q_perm_dev)
        return torch.split(qp, self.q_head_counts, dim=1)  # ok: FC101

    def kv_split_sizes(self) -> List[int]:
        # heads per group in the permuted order (kept on the device next to the permutation)
        return torch.bincount(self.kv_group_of_head_dev, minlength=self.num_groups).tolist()  # expect: FC101

    def split_kv(self, k: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        kp = k.index_select(1, self.kv_perm_dev)
        return torch.split(kp, self.kv_split_sizes(), dim=1)

    def merge(self, outs: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat(list(outs), dim=1).index_select(1, self.q_inv_perm_dev)
