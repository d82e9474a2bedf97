"""Greedy tree acceptance and the draft pool's rollback to the accepted prefix."""

from dataclasses import dataclass

import torch

from twospec.config import SpecConfig
from twospec.draft.kv_pool import DraftKVPool
from twospec.tree import DraftTree


@dataclass
class AcceptResult:
    accept_len: torch.Tensor
    path_tokens: torch.Tensor
    flat_tokens: torch.Tensor
    rate: torch.Tensor


class TreeVerifier:
    def __init__(self, cfg: SpecConfig, draft_pool: DraftKVPool) -> None:
        self.cfg = cfg
        self.draft_pool = draft_pool
        self.max_depth = cfg.max_tree_depth()
        self.page_size = cfg.page_size
        self.path_tokens = torch.zeros(cfg.max_batch_size, self.max_depth + 1, dtype=torch.long, device=cfg.device)
        self.accept_len_host = torch.zeros(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.accept_event = torch.cuda.Event()

    def accept(self, tree: DraftTree, target_ids: torch.Tensor, bs: int) -> AcceptResult:
        k = tree.num_nodes
        parent = tree.parents.clamp(min=0)
        # a node matches when the target, run at its parent, predicted its token
        match = tree.tokens == torch.gather(target_ids, 1, parent)
        match[:, 0] = True
        accepted = match.clone()
        for _ in range(tree.max_depth):
            accepted = match & torch.gather(accepted, 1, parent)
        node_depth = torch.where(accepted, tree.depth, -1)  # ok: FC101
        best_depth, best_node = node_depth.max(dim=1)
        accept_len = best_depth + 1
        flat = torch.masked_select(tree.tokens, accepted)  # expect: FC101
        # walk from the best node up to the root, writing each token at its depth
        path = self.path_tokens[:bs]
        cur = best_node
        for _ in range(tree.max_depth + 1):
            tok = torch.gather(tree.tokens, 1, cur[:, None])
            dep = torch.gather(tree.depth, 1, cur[:, None])
            path.scatter_(1, dep, tok)
            cur = torch.gather(parent, 1, cur[:, None]).squeeze(1)
        accepted_path = path[:, : accept_len.max()]  # expect: FC101
        # the draft pool holds KV for every drafted depth: keep only the accepted prefix
        new_lens = self.draft_pool.committed_lens[:bs] + accept_len.to(torch.int32)
        self.draft_pool.committed_lens[:bs].copy_(new_lens)
        self.draft_pool.seq_lens[:bs].copy_(new_lens)
        new_last = (new_lens - 1) % self.page_size + 1
        self.draft_pool.kv_last_page_len[:bs].copy_(new_last)  # expect: FC104
        if self.accept_len_host.numel() < bs:
            self.accept_len_host = torch.zeros(bs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.accept_len_host[:bs].copy_(accept_len, non_blocking=True)
        self.accept_event.record()
        return AcceptResult(
            accept_len=accept_len,
            path_tokens=accepted_path,
            flat_tokens=flat,
            rate=accept_len.float().mean() / k,
        )
