from __future__ import annotations

import torch
import torch.nn as nn

from bloomserve.forward_batch import ForwardBatch
from bloomserve.layers.bloom_attention import BloomBlock


class BloomForCausalLM(nn.Module):
    def __init__(self, cfg, tp_size: int, attn_backend):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.word_embeddings_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList([BloomBlock(cfg, tp_size, i, attn_backend) for i in range(cfg.num_layers)])
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.word_embeddings_layernorm(self.word_embeddings(input_ids))
        for layer in self.layers:
            h = layer(h, fb)
        return torch.matmul(self.ln_f(h), self.word_embeddings.weight.t())
