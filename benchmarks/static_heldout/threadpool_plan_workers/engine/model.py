"""Decoder stack shared by the graph runner and the eager step; layers differ only in their attention kind."""
from dataclasses import dataclass
from typing import List

import torch

from engine.attention import FlashInferAttention
from poolserve import ServeConfig, StepBatch


@torch.jit.script
def apply_soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    assert cap > 0.0, "soft cap must be positive"  # ok: FC109
    return torch.tanh(logits / cap) * cap


@dataclass(frozen=True)
class LayerSpec:
    index: int
    window: int = -1
    soft_cap: float = 0.0
    chunked_local: bool = False


class DecodeModel:
    def __init__(self, cfg: ServeConfig, attn: FlashInferAttention, kv_caches: List[torch.Tensor]):
        self.cfg, self.attn, self.kv_caches = cfg, attn, kv_caches
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.specs = [
            LayerSpec(i, cfg.sliding_window if i in cfg.window_layers else -1,
                      cfg.logits_soft_cap if i in cfg.softcap_layers else 0.0, chunked_local=i == cfg.num_layers - 1)
            for i in range(cfg.num_layers)
        ]
        self.embed = torch.nn.Embedding(cfg.vocab_size, hidden)
        self.q_proj = [torch.nn.Linear(hidden, hidden, bias=False) for _ in self.specs]
        self.kv_proj = [torch.nn.Linear(hidden, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False) for _ in self.specs]
        self.lm_head = torch.nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.draft_proj = torch.nn.Linear(hidden, hidden, bias=False) if cfg.num_draft_tokens else None

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.unflatten(-1, (heads, self.cfg.head_dim))

    def forward_decode(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for spec in self.specs:
            q = self._heads(self.q_proj[spec.index](h), self.cfg.num_qo_heads)
            h = h + self.attn.decode(q, self.kv_caches[spec.index], spec, bs).flatten(1)
        if self.draft_proj is not None:
            rows = torch.repeat_interleave(self.draft_proj(h), self.cfg.num_draft_tokens, dim=0)  # ok: FC101
            draft = self.attn.draft_step(self._heads(rows, self.cfg.num_qo_heads), self.kv_caches[-1])
            h = h + self.attn.verify_step(draft, self.kv_caches[-1]).unflatten(0, (bs, -1)).mean(1).flatten(1)
        return apply_soft_cap(self.lm_head(h), self.cfg.logits_soft_cap)

    def forward_eager(self, batch: StepBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        trtllm = self.cfg.decode_backend == "trtllm-gen"
        for spec in self.specs:
            q, kv = self._heads(self.q_proj[spec.index](h), self.cfg.num_qo_heads), self.kv_caches[spec.index]
            if trtllm:
                h = h + self.attn.decode_trtllm(q, kv, batch.seq_lens, batch.req_slots).flatten(1)
            else:
                h = h + self.attn.decode_eager(q, kv).flatten(1)
        return self.lm_head(h)

    def forward_extend(self, batch: StepBatch, ragged: bool) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for spec in self.specs:
            q = self._heads(self.q_proj[spec.index](h), self.cfg.num_qo_heads)
            k, v = self._heads(self.kv_proj[spec.index](h), 2 * self.cfg.num_kv_heads).chunk(2, dim=1)
            h = h + self.attn.extend(q, k, v, self.kv_caches[spec.index], ragged).flatten(1)
        return self.lm_head(h)
