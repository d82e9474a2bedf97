"""Decoder stand-in: every query projection carries the batch's LoRA deltas."""

import torch
from torch import nn

from slora.adapters import AdapterRegistry
from slora.config import SLoRAConfig
from slora_engine.attention import UnifiedPagedAttention
from slora_engine.metadata import LoRAStepMeta


class SLoRADecoder(nn.Module):
    def __init__(self, cfg: SLoRAConfig, attn: UnifiedPagedAttention, registry: AdapterRegistry):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.registry = registry
        hidden = cfg.hidden_size
        q_dim = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.q_proj = nn.ModuleList([nn.Linear(hidden, q_dim, bias=False) for _ in range(cfg.num_layers)])
        self.o_proj = nn.ModuleList([nn.Linear(q_dim, hidden, bias=False) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def _project_decode(self, h: torch.Tensor, layer: int, meta: LoRAStepMeta) -> torch.Tensor:
        a, b = self.registry.adapter_stacks(layer)
        delta = self.attn.lora_delta_decode(h, a, b, meta)
        return self.q_proj[layer](h) + delta[:, : self.q_proj[layer].out_features]

    def _project_prefill(self, h: torch.Tensor, layer: int, meta: LoRAStepMeta) -> torch.Tensor:
        a, b = self.registry.adapter_stacks(layer)
        delta = self.attn.lora_delta_prefill(h, a, b, meta)
        return self.q_proj[layer](h) + delta[:, : self.q_proj[layer].out_features]

    def forward_decode(self, input_ids: torch.Tensor, meta: LoRAStepMeta, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in range(self.cfg.num_layers):
            q = self._project_decode(h, layer, meta).view(bs, self.cfg.num_qo_heads, self.cfg.head_dim)
            o = self.attn.forward_decode(q, layer, bs)
            h = h + self.o_proj[layer](o.reshape(bs, -1))
        return self.lm_head(h)

    def forward_prefill(self, input_ids: torch.Tensor, meta: LoRAStepMeta) -> torch.Tensor:
        n = input_ids.shape[0]
        h = self.embed(input_ids)
        for layer in range(self.cfg.num_layers):
            q = self._project_prefill(h, layer, meta).view(n, self.cfg.num_qo_heads, self.cfg.head_dim)
            o = self.attn.forward_prefill(q, layer)
            h = h + self.o_proj[layer](o.reshape(n, -1))
        return self.lm_head(h)
