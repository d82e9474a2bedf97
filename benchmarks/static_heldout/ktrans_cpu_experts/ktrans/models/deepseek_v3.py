"""A stand-in DeepSeek-V3 with KTransformers-style injected operators."""
from __future__ import annotations

import torch
from torch import nn

from ktrans.operators.attention import KDeepseekV2Attention, KNextNLayer
from ktrans.operators.experts import CPUInfer, KDeepseekMoE


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx: int, cpu_infer: CPUInfer, device: torch.device):
        super().__init__()
        self.input_norm, self.post_norm = nn.RMSNorm(cfg.hidden_size), nn.RMSNorm(cfg.hidden_size)
        self.self_attn = KDeepseekV2Attention(cfg, layer_idx, device)
        self.mlp = KDeepseekMoE(cfg, layer_idx, cpu_infer, device)

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn.decode(self.input_norm(h), kv_cache)
        return h + self.mlp(self.post_norm(h))

    def prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn.prefill(self.input_norm(h), kv_cache)
        return h + self.mlp(self.post_norm(h))


class DeepseekV3ForCausalLM(nn.Module):
    def __init__(self, cfg, cpu_infer: CPUInfer, device: torch.device):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, cpu_infer, device) for i in range(cfg.num_layers))
        self.norm, self.lm_head = nn.RMSNorm(cfg.hidden_size), nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.nextn = KNextNLayer(cfg, device) if cfg.use_nextn else None
        shape = (cfg.max_pages, cfg.page_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers + 1)]

    def forward_decode(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        h = embeds = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, kv)
        logits = self.lm_head(self.norm(h))
        if self.nextn is not None:
            draft = self.nextn(self.norm(h), embeds, self.kv_caches[-1])
            logits = torch.cat([logits, self.lm_head(draft)], dim=0)
        return logits

    def forward_prefill(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # positions only feed the rope kernel inside the layers
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.prefill(h, kv)
        return self.lm_head(self.norm(h))
