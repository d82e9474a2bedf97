"""Lightning indexer of DeepSeek sparse attention: cheap heads score every cached token of a request and
the top-k token slots go to the sparse MLA kernel."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from mtm.config import EngineConfig
from mtm.kvcache import ForwardBatch


class SparseIndexer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, index_topk: int, backend, kv_pool):
        super().__init__()
        assert index_topk % 64 == 0  # expect: FC109
        m = cfg.model
        self.layer_id = layer_id
        self.topk = index_topk
        self.n_heads, self.head_dim = m.index_n_heads, m.index_head_dim
        self.wq = nn.Linear(m.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(m.hidden_size, self.head_dim, bias=False)
        self.weights_proj = nn.Linear(m.hidden_size, self.n_heads, bias=False)
        self.backend = backend
        self.kv_pool = kv_pool
        self.max_bs, self.max_ctx = cfg.max_running_requests, cfg.max_context_len
        self.scores_buf: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor, q_lora: torch.Tensor, fb: ForwardBatch) -> None:
        bs = x.shape[0]
        max_len = fb.max_seq_len
        if self.scores_buf is None:
            self.scores_buf = torch.empty((self.max_bs, self.max_ctx), dtype=torch.float32, device=x.device)  # ok: FC107
        q = self.wq(q_lora).view(bs, self.n_heads, self.head_dim)
        head_w = self.weights_proj(x).float() * self.head_dim ** -0.5
        index_k = self.kv_pool.index_k[self.layer_id]
        index_k[fb.out_cache_loc] = self.wk(x).to(index_k)

        tok = self.kv_pool.req_to_token[fb.req_pool_indices, :max_len]
        keys = index_k[tok]
        logits = torch.einsum("bhd,bld->bhl", q.float(), keys.float()).relu_()
        scores = torch.sum(logits * head_w.unsqueeze(-1), dim=1, out=self.scores_buf[:bs, :max_len])
        pos = torch.arange(max_len, device=x.device)
        valid = pos.unsqueeze(0) < fb.seq_lens.unsqueeze(1)
        scores = torch.where(valid, scores, torch.full_like(scores, float("-inf")))  # ok: FC101
        k = min(self.topk, max_len)
        sel = torch.gather(tok, 1, scores.topk(k, dim=-1).indices)

        # requests whose whole context fits in top-k attend densely
        short = fb.seq_lens <= self.topk
        dense_reqs = fb.req_pool_indices[short]  # expect: FC101
        self.backend.mark_dense(dense_reqs)
        self.backend.sparse_indices[: bs * k].copy_(sel.flatten().to(self.backend.sparse_indices))
