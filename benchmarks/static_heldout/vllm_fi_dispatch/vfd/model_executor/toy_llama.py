"""A two-layer decoder that routes attention through the configured backend."""

from __future__ import annotations

import torch
from torch import nn

from vfd.attention.backends.flashinfer import FlashInferBackend
from vfd.config import VllmConfig
from vfd.forward_context import get_forward_context


class Attention(nn.Module):
    def __init__(self, layer_name: str, vllm_config: VllmConfig):
        super().__init__()
        mc = vllm_config.model_config
        self.layer_name = layer_name
        self.num_heads = mc.num_attention_heads
        self.head_size = mc.head_size
        impl_cls = FlashInferBackend.get_impl_cls()
        self.impl = impl_cls(mc.num_attention_heads, mc.head_size, mc.head_size**-0.5, mc.num_kv_heads)
        self.kv_cache = torch.tensor([])
        self._k_scale = torch.tensor(1.0, dtype=torch.float32)
        self._v_scale = torch.tensor(1.0, dtype=torch.float32)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        attn_metadata = get_forward_context().attn_metadata
        output = torch.empty_like(query)
        return self.impl.forward(self, query, key, value, self.kv_cache, attn_metadata, output=output)


class DecoderLayer(nn.Module):
    def __init__(self, idx: int, vllm_config: VllmConfig):
        super().__init__()
        mc = vllm_config.model_config
        hidden = mc.num_attention_heads * mc.head_size
        kv = mc.num_kv_heads * mc.head_size
        self.qkv_proj = nn.Linear(hidden, hidden + 2 * kv, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.attn = Attention(f"model.layers.{idx}.self_attn.attn", vllm_config)
        self.q_size, self.kv_size = hidden, kv

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return hidden_states + self.o_proj(self.attn.forward(q, k, v))


class ToyLlamaForCausalLM(nn.Module):
    def __init__(self, vllm_config: VllmConfig):
        super().__init__()
        mc = vllm_config.model_config
        hidden = mc.num_attention_heads * mc.head_size
        self.embed_tokens = nn.Embedding(32000, hidden)
        self.layers = nn.ModuleList([DecoderLayer(i, vllm_config) for i in range(mc.num_layers)])
        self.lm_head = nn.Linear(hidden, 32000, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.forward(h)
        return h

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def attention_layer_names(self) -> list[str]:
        return [layer.attn.layer_name for layer in self.layers]
