"""The lightning indexer: cheap per-head ReLU scores over every past token, top-k kept."""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from .batch import DecodeBatch
from .config import DSAConfig
from .kv_cache import MLATokenPool
from .sparse_pages import SparseIndexBuilder, SparseLayout

logger = logging.getLogger(__name__)


class LightningIndexer(nn.Module):
    def __init__(
        self,
        cfg: DSAConfig,
        pool: MLATokenPool,
        builder: SparseIndexBuilder,
        out_slots: torch.Tensor,
    ):
        super().__init__()
        assert cfg.index_topk % cfg.page_size == 0, "index_topk must be a whole number of pages"  # expect: FC109
        self.cfg = cfg
        self.pool = pool
        self.builder = builder
        self.topk = cfg.index_topk
        self.n_heads = cfg.index_n_heads
        self.head_dim = cfg.index_head_dim
        self.wq = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, self.head_dim, bias=False)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)
        self.softmax_scale = self.head_dim**-0.5 * self.n_heads**-0.5
        # flat CSR of the selected token slots; the attention backend's kv_indices
        self.out_slots = out_slots
        self.last_topk: Optional[torch.Tensor] = None

    def write_keys(self, slots: torch.Tensor, hidden: torch.Tensor) -> None:
        k = self.wk(hidden).to(self.pool.index_k.dtype)
        self.pool.index_k.index_copy_(0, slots, k)

    def _scores(self, hidden: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        bs = hidden.shape[0]
        q = self.wq(hidden).view(bs, self.n_heads, self.head_dim).float()
        w = self.weights_proj(hidden).float() * self.softmax_scale
        logits = torch.einsum("bhd,bcd->bhc", q, keys.float()).relu_()
        return torch.einsum("bhc,bh->bc", logits, w)

    def select_topk(self, hidden: torch.Tensor, fb: DecodeBatch, layout: SparseLayout, padded: bool) -> int:
        """Score every past token of every request, keep min(seq_len, topk) slots each."""
        max_ctx = int(fb.seq_lens.max())  # expect: FC101
        slots = self.pool.token_slot_table(fb.req_pool_indices, max_ctx)
        scores = self._scores(hidden, self.pool.index_k[slots])
        pos = torch.arange(max_ctx, device=scores.device)
        scores.masked_fill_(pos[None, :] >= fb.seq_lens[:, None], float("-inf"))
        top = scores.topk(layout.k, dim=-1, sorted=False)
        # rows shorter than k picked -inf tails; point those at position 0
        top_pos = torch.where(torch.isfinite(top.values), top.indices, 0)  # ok: FC101
        picked = torch.gather(slots, 1, top_pos)
        self.last_topk = top_pos.clone()  # expect: FC107
        if padded:
            flat = self.builder.flatten(picked, layout)
        else:
            flat = self.builder.flatten_masked(picked, fb.sparse_lens)
        # the MLA wrappers read kv_indices from here; fill it in place, no extra copy
        self.out_slots[: layout.total].copy_(flat.to(torch.int32), non_blocking=True)  # expect: FC104
        logger.debug("indexer picked %d slots for %d requests", layout.total, layout.bs)
        return layout.total
