"""Verify graphs: one per batch bucket, each over ``max_tree_nodes`` tokens per row."""

from typing import Dict, Tuple

import torch

from spec_target.target_model import TargetLM
from spec_target.verify_attn import TreeVerifyAttention
from twospec.config import SpecConfig
from twospec.tree import DraftTree


class VerifyGraphRunner:
    def __init__(self, cfg: SpecConfig, model: TargetLM, attn: TreeVerifyAttention) -> None:
        self.cfg = cfg
        self.model = model
        self.attn = attn
        n = cfg.max_batch_size * cfg.max_tree_nodes
        self.static_tokens = torch.zeros(n, dtype=torch.long, device=cfg.device)
        self.static_pos = torch.zeros(n, dtype=torch.long, device=cfg.device)
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def record_verify(self, bs: int) -> None:
        cfg = self.cfg
        k = cfg.max_tree_nodes
        w = self.attn.bind_verify_bucket(bs)
        # a dummy tree: two pages per row, every node sees everything
        w.plan(
            torch.arange(0, (bs + 1) * k, k, dtype=torch.int32),
            torch.arange(0, 2 * (bs + 1), 2, dtype=torch.int32),
            torch.zeros(2 * bs, dtype=torch.int32, device=cfg.device),
            torch.full((bs,), cfg.page_size, dtype=torch.int32),
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            custom_mask=torch.ones(bs * k * 2 * cfg.page_size, dtype=torch.bool, device=cfg.device),
        )
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits, hidden = self.model.verify_forward(self.static_tokens[: bs * k], self.static_pos[: bs * k], bs)
        torch.cuda.current_stream().synchronize()  # ok: FC101
        self.graphs[bs] = (g, logits, hidden)

    def replay_verify(self, bs: int, tree: DraftTree, positions: torch.Tensor):
        k = self.cfg.max_tree_nodes
        m = tree.num_nodes
        self.static_tokens[: bs * k].view(bs, k)[:, :m].copy_(tree.tokens)
        self.static_pos[: bs * k].view(bs, k)[:, :m].copy_(positions)
        g, logits, hidden = self.graphs[bs]
        g.replay()
        return logits[: bs * k].view(bs, k, -1)[:, :m], hidden[: bs * k].view(bs, k, -1)[:, :m]
