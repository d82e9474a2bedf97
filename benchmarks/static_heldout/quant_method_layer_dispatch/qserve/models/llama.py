"""Llama / Mistral decoder: dense MLP, one optional sliding window shared by every layer."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from qserve.attention.layer import Attention
from qserve.config import EngineConfig, ModelConfig
from qserve.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    get_tensor_model_parallel_world_size,
)
from qserve.layers.quantization.base_config import QuantizationConfig


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, device: torch.device | str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + residual
        variance = x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True)
        return (x.to(torch.float32) * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight, x


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, max_position: int, base: float, device: torch.device | str) -> None:
        super().__init__()
        self.head_size = head_size
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32, device=device) / head_size))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device), inv_freq)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.view(x.shape[0], -1, self.head_size).chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype).view_as(x)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        cos, sin = self.cos_sin_cache.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, quant_config: Optional[QuantizationConfig], prefix: str,
                 device: torch.device | str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2,
                                                       bias=False, quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj", device=device)
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=False,
                                           quant_config=quant_config, prefix=f"{prefix}.down_proj", device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        d = gate_up.shape[-1] // 2
        x, _ = self.down_proj(F.silu(gate_up[..., :d]) * gate_up[..., d:])
        return x


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, engine_config: EngineConfig, quant_config: Optional[QuantizationConfig],
                 prefix: str, device: torch.device | str) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads // tp_size
        self.num_kv_heads = max(1, config.num_key_value_heads // tp_size)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, config.num_attention_heads,
                                          config.num_key_value_heads, quant_config=quant_config,
                                          prefix=f"{prefix}.qkv_proj", device=device)
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj", device=device)
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.max_model_len, config.rope_theta, device)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, engine_config,
                              quant_config=quant_config, prefix=f"{prefix}.attn",
                              sliding_window=config.sliding_window, device=device)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: Any) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn(q, k, v, kv_cache, attn_metadata))
        return output


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, engine_config: EngineConfig, quant_config: Optional[QuantizationConfig],
                 prefix: str, device: torch.device | str) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, engine_config, quant_config, f"{prefix}.self_attn", device)
        self.mlp = LlamaMLP(config, quant_config, f"{prefix}.mlp", device)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, device)

    def forward(self, positions, hidden_states, residual, kv_cache, attn_metadata):
        hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaForCausalLM(nn.Module):
    # checkpoint projection -> (fused module, offset index of the shard)
    _STACKED = {".q_proj": (".qkv_proj", 0), ".k_proj": (".qkv_proj", 1), ".v_proj": (".qkv_proj", 2),
                ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}

    def __init__(self, config: ModelConfig, engine_config: EngineConfig, quant_config: Optional[QuantizationConfig],
                 device: torch.device | str = "cuda") -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device=device,
                                         dtype=config.torch_dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, engine_config, quant_config, f"model.layers.{i}", device)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device)
        # The LM head stays unquantized.
        self.lm_head = ColumnParallelLinear(config.hidden_size, config.vocab_size, bias=False, gather_output=True,
                                            prefix="lm_head", device=device)

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        hidden_states = self.embed_tokens(input_ids)
        residual = torch.zeros_like(hidden_states)
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden_states, residual = layer(positions, hidden_states, residual, kv_cache, attn_metadata)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits, _ = self.lm_head(hidden_states)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        for name, loaded_weight in weights:
            name = name.removeprefix("model.")
            if name.endswith((".k_scale", ".v_scale")):
                # "...self_attn.k_proj.k_scale" -> "...self_attn.attn.k_scale"
                layer_prefix, scale_name = name.rsplit(".", 1)
                name = f"{layer_prefix.rsplit('.self_attn', 1)[0]}.self_attn.attn.{scale_name}"
            shard_index = None
            for ckpt_name, (fused_name, index) in self._STACKED.items():
                if ckpt_name in name:
                    name, shard_index = name.replace(ckpt_name, fused_name), index
                    break
            param = params.get(name)
            if param is None:
                continue
            module = self.get_submodule(name.rsplit(".", 1)[0])
            loader = getattr(module, "weight_loader", None)
            if loader is None:
                param.data.copy_(loaded_weight)
            elif shard_index is None:
                loader(param, loaded_weight)
            else:
                loader(param, loaded_weight, sum(module.output_partition_sizes[:shard_index]))
