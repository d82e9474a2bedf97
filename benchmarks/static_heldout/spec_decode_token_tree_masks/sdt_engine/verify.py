"""Acceptance on the device: a node is accepted when it and all its ancestors match the target's argmax."""
from dataclasses import dataclass
from typing import List

import flashcheck
import torch

from sdt import TokenTree, TreeBatch


@dataclass
class AcceptResult:
    best_node: torch.Tensor     # [bs] deepest accepted node
    accept_lens: torch.Tensor   # [bs] accepted tokens, the bonus token included
    path_nodes: torch.Tensor    # [bs, max_depth + 1] accepted path, -1 past its end
    next_tokens: torch.Tensor   # [bs] the target's token after the accepted path
    accept_lens_list: List[int]


class Verifier:
    def __init__(self, tree: TokenTree, device: torch.device):
        self.tree = tree
        self.parents_dev = torch.from_numpy(tree.parents_np).long().clamp(min=0).to(device)
        self.depth_dev = torch.from_numpy(tree.depth_np).long().to(device)
        self.ancestors_dev = torch.from_numpy(tree.ancestors_np).to(device)
        self.last_lens_cpu = torch.zeros(0, dtype=torch.int32)

    @flashcheck.hot_path
    def accept(self, logits: torch.Tensor, batch: TreeBatch) -> AcceptResult:
        bs, n = batch.draft_tokens.shape
        target = torch.argmax(logits.view(bs, n, -1), dim=-1)
        match = batch.draft_tokens == target[:, self.parents_dev]
        match[:, 0] = True
        for _ in range(self.tree.max_depth):
            match = match & match[:, self.parents_dev]
        depth = torch.where(match, self.depth_dev, -1)  # ok: FC101
        best = depth.argmax(dim=1)
        accept_lens = depth.gather(1, best[:, None])[:, 0] + 1
        path = self.ancestors_dev[best]
        next_tokens = target.gather(1, best[:, None])[:, 0]
        lens = accept_lens.tolist()  # expect: FC101
        self.last_lens_cpu = torch.tensor(lens, dtype=torch.int32)  # ok: FC107
        return AcceptResult(best, accept_lens, path, next_tokens, lens)
