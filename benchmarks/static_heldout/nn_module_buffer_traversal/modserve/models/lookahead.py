"""A one-layer lookahead head that proposes draft tokens from the last hidden state.

It attends over the last decoder layer's KV with its own FlashInfer decode wrapper,
planned from its own registered buffers.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from torch import nn

from modserve.batch import ForwardBatch
from modserve.config import PAGE_SIZE, EngineConfig

# Plan state the draft wrapper borrows from the main decode wrapper when both
# attend to the same pages with the same lengths.
_SHARED_PLAN_ATTRS = ("_plan_info", "_cached_module")


class LookaheadHead(nn.Module):
    LOOKAHEAD_WS_BYTES = 32 << 20

    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.cfg = cfg
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.max_draft = cfg.lookahead_k
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.head = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.vocab_size, bias=False)
        max_bs = cfg.max_num_reqs
        self.register_buffer("draft_kv_indptr", torch.zeros(max_bs + 1, dtype=torch.int32), persistent=False)
        self.register_buffer("draft_last_page_len", torch.ones(max_bs, dtype=torch.int32), persistent=False)
        self.register_buffer("draft_len", torch.ones(1, dtype=torch.int32), persistent=False)
        self.draft_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self.kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def init_draft_wrapper(self, kv_cache: Tuple[torch.Tensor, torch.Tensor]) -> None:
        # Called after model.to(device): the buffers above are on the GPU by now.
        device = self.draft_kv_indptr.device
        self.workspace = torch.zeros(self.LOOKAHEAD_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.kv_cache = kv_cache

    def plan_draft(
        self,
        fb: ForwardBatch,
        kv_indices: torch.Tensor,
        main_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None,
    ) -> None:
        bs = fb.batch_size
        if main_wrapper is not None and self.cfg.lookahead_reuse_plan:
            for attr in _SHARED_PLAN_ATTRS:
                setattr(self.draft_wrapper, attr, getattr(main_wrapper, attr))  # expect: FC103
            return
        self.draft_wrapper.plan(  # expect: FC102
            self.get_buffer("draft_kv_indptr")[: bs + 1],
            kv_indices,
            self.get_buffer("draft_last_page_len")[:bs],
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            PAGE_SIZE,
            q_data_type=self.cfg.kv_dtype,
            kv_data_type=self.cfg.kv_dtype,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        steps = int(self.draft_len[0])  # expect: FC101
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)
        out = self.draft_wrapper.run(q, self.kv_cache)  # expect: FC108
        logits = self.head(out.reshape(q.shape[0], -1))
        return logits.topk(max(steps, 1), dim=-1).indices
