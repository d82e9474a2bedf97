"""EAGLE-2 drafter: a one-layer draft model expanded `depth` levels with top-k branching, one FlashInfer decode
wrapper per level, then reranked into a dynamic tree; accepted tokens are re-encoded with a trtllm-gen context."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Sequence, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from .batch import SpecForwardBatch
from .tree import DynamicTree, build_dynamic_tree, pack_tree_mask

if TYPE_CHECKING:
    from .verify_backend import TreeVerifyBackend


@dataclass(frozen=True)
class Eagle2Config:
    topk: int = 8
    depth: int = 6
    total_tokens: int = 60
    max_bs: int = 32
    max_pages: int = 512
    max_extend_tokens: int = 8
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    verify_bs: Sequence[int] = (1, 2, 4, 8, 16, 32)
    tree_sizes: Sequence[int] = (16, 32, 60)


def _draft_workspace_bytes() -> int:
    return int(os.environ.get("EAGLE2_DRAFT_WORKSPACE_MB", "128")) << 20


class Eagle2Drafter:
    _SHARED_PLAN_STATE = ("_plan_info",)

    def __init__(self, cfg: Eagle2Config, model, verify_backend: "TreeVerifyBackend", device: torch.device):
        self.cfg, self.model, self.verify_backend, self.device = cfg, model, verify_backend, device
        self.draft_ws = torch.zeros(_draft_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        extend_bytes = cfg.max_bs * cfg.max_extend_tokens * cfg.num_heads * (cfg.head_dim + 1) * 4 * 8
        self.extend_ws = torch.empty(extend_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.level_wrappers = [BatchDecodeWithPagedKVCacheWrapper(self.draft_ws, "NHD", use_tensor_cores=True)
                               for _ in range(cfg.depth)]
        n = cfg.max_bs * cfg.topk
        self.draft_kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.draft_last_page_len = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self._plan_info: Tuple[int, int] = (0, 0)

    def plan_levels(self, fb: SpecForwardBatch) -> None:
        """Plan level 0 once; deeper levels differ by one token per branch, so they share its split plan."""
        cfg, n = self.cfg, fb.batch_size * self.cfg.topk
        pages = fb.seq_lens.repeat_interleave(cfg.topk).add(cfg.depth + cfg.page_size - 1) // cfg.page_size
        torch.cumsum(pages, 0, out=self.draft_kv_indptr[1 : n + 1])
        first = self.level_wrappers[0]
        first.plan(self.draft_kv_indptr[: n + 1], fb.draft_kv_indices, self.draft_last_page_len[:n],  # expect: FC102
                   cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        for w in self.level_wrappers[1:]:
            for name in self._SHARED_PLAN_STATE:
                setattr(w, name, getattr(first, name))  # expect: FC103
        self._plan_info = (fb.batch_size, cfg.topk)  # ok: FC103

    def draft_level(self, d: int, tokens: torch.Tensor, hidden: torch.Tensor, kv_cache) -> Tuple[torch.Tensor, torch.Tensor]:
        q, h = self.model.step_inputs(tokens, hidden)
        out = self.level_wrappers[d].run(q, kv_cache)  # expect: FC108
        return self.model.step_outputs(out, h)

    def draft(self, fb: SpecForwardBatch, hidden: torch.Tensor) -> DynamicTree:
        cfg, bs = self.cfg, fb.batch_size
        self.plan_levels(fb)
        top = self.model.logits(hidden).log_softmax(-1).topk(cfg.topk, dim=-1)
        cum, tok = top.values, top.indices  # [bs, k]
        parent = torch.full((bs, cfg.topk), -1, dtype=torch.long, device=self.device)
        scores: List[torch.Tensor] = []
        tokens: List[torch.Tensor] = []
        parents: List[torch.Tensor] = []
        h = hidden.repeat_interleave(cfg.topk, 0)
        for d in range(cfg.depth):
            scores.append(cum)
            tokens.append(tok)
            parents.append(parent)
            logits, h = self.draft_level(d, tok.flatten(), h, fb.draft_kv_cache)
            child = logits.log_softmax(-1).view(bs, cfg.topk, -1).topk(cfg.topk, dim=-1)
            flat = (cum[..., None] + child.values).flatten(1)  # [bs, k*k]
            best = flat.topk(cfg.topk, dim=-1).indices
            cum, tok = flat.gather(1, best), child.indices.flatten(1).gather(1, best)
            parent = d * cfg.topk + best // cfg.topk
            h = h.view(bs, cfg.topk, -1).gather(1, (best // cfg.topk)[..., None].expand(-1, -1, h.shape[-1])).flatten(0, 1)
        tree = build_dynamic_tree(torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(parents, 1),
                                  cfg.total_tokens, cfg.depth)
        packed, _ = pack_tree_mask(tree.mask, fb.seq_lens_cpu[:bs].tolist())  # ok: FC101
        # stage the mask where the verify graph reads it; saves a copy in prepare_verify
        self.verify_backend.custom_mask[: packed.numel()].copy_(packed, non_blocking=True)  # expect: FC104
        return tree

    def extend_accepted(self, q: torch.Tensor, fb: SpecForwardBatch, max_accept: int) -> torch.Tensor:
        cfg = self.cfg
        return trtllm_batch_context_with_kv_cache(
            q, fb.draft_kv_cache, self.extend_ws, fb.block_tables, fb.seq_lens, max_accept, fb.max_seq_len_cpu,
            cfg.head_dim ** -0.5, 1.0, fb.batch_size, fb.cu_accept_lens, fb.cu_seq_lens)
