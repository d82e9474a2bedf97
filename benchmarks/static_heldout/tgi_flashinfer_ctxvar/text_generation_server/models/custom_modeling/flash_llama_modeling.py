"""Llama for the flash path: FlashInfer attention over a paged cache and an optional speculator head."""

import math
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from text_generation_server.layers.attention import KVCache, Seqlen, attention, paged_attention


class SpeculativeOutput(NamedTuple):
    logits: torch.Tensor
    speculative_logits: Optional[torch.Tensor]


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, *, device, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if residual is not None:
            hidden_states = hidden_states + residual
        residual = hidden_states
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        normed = hidden_states.float() * torch.rsqrt(variance + self.eps)
        return (self.weight * normed).to(hidden_states.dtype), residual


class PositionRotaryEmbedding(nn.Module):
    def __init__(self, dim: int, base: float, *, device: torch.device):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._seq_len_cached = 0
        self._cos_sin_cached: Optional[torch.Tensor] = None

    def _update_cos_sin_cache(self, dtype: torch.dtype, device: torch.device, seqlen: int) -> None:
        # Grow the table when a longer sequence shows up; doubling keeps regrowth rare.
        if self._cos_sin_cached is None or seqlen > self._seq_len_cached or self._cos_sin_cached.dtype != dtype:
            self._seq_len_cached = max(seqlen, 2 * self._seq_len_cached)
            t = torch.arange(self._seq_len_cached, device=device, dtype=self.inv_freq.dtype)
            freqs = torch.outer(t, self.inv_freq)
            self._cos_sin_cached = torch.empty((2, *freqs.shape), dtype=dtype, device=device)  # expect: FC107
            self._cos_sin_cached[0].copy_(torch.cos(freqs))
            self._cos_sin_cached[1].copy_(torch.sin(freqs))

    def get_cos_sin(self, position_ids: torch.Tensor, max_s: int, dtype: torch.dtype):
        self._update_cos_sin_cache(dtype, position_ids.device, max_s)
        cos = torch.index_select(self._cos_sin_cached[0], 0, position_ids)
        sin = torch.index_select(self._cos_sin_cached[1], 0, position_ids)
        return cos.unsqueeze(1), sin.unsqueeze(1)


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    x1, x2 = x.chunk(2, dim=-1)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    x.copy_(torch.cat([o1, o2], dim=-1))


class FlashLlamaAttention(nn.Module):
    def __init__(self, config, *, device, dtype):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_size = config.hidden_size // self.num_heads
        self.softmax_scale = self.head_size**-0.5
        self.query_key_value = nn.Linear(
            config.hidden_size,
            (self.num_heads + 2 * self.num_key_value_heads) * self.head_size,
            bias=False,
            device=device,
            dtype=dtype,
        )
        self.o_proj = nn.Linear(self.num_heads * self.head_size, config.hidden_size, bias=False, device=device, dtype=dtype)

    def forward(self, hidden_states, cos, sin, cu_seqlen_prefill, kv_cache: KVCache, slots, seqlen: Seqlen):
        qkv = self.query_key_value(hidden_states)
        query, kv = qkv.split(
            [self.num_heads * self.head_size, 2 * self.num_key_value_heads * self.head_size], dim=1
        )
        query = query.view(-1, self.num_heads, self.head_size)
        kv = kv.view(-1, 2, self.num_key_value_heads, self.head_size)
        _apply_rotary(query, cos, sin)
        _apply_rotary(kv[:, 0], cos, sin)
        kv_cache.store(key=kv[:, 0], value=kv[:, 1], slots=slots)
        if cu_seqlen_prefill is not None:
            attn_output = attention(
                query=query,
                key=kv[:, 0],
                value=kv[:, 1],
                kv_cache=kv_cache,
                seqlen=seqlen,
                softmax_scale=self.softmax_scale,
            )
        else:
            attn_output = paged_attention(query, kv_cache, seqlen)
        return self.o_proj(attn_output.view(-1, self.num_heads * self.head_size))


class LlamaMLP(nn.Module):
    def __init__(self, config, *, device, dtype):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False, device=device, dtype=dtype)

    def forward(self, hidden_states):
        gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class FlashLlamaLayer(nn.Module):
    def __init__(self, config, *, device, dtype):
        super().__init__()
        self.self_attn = FlashLlamaAttention(config, device=device, dtype=dtype)
        self.mlp = LlamaMLP(config, device=device, dtype=dtype)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, device=device, dtype=dtype)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, device=device, dtype=dtype)

    def forward(self, hidden_states, residual, cos, sin, cu_seqlen_prefill, kv_cache, slots, seqlen):
        normed, res = self.input_layernorm(hidden_states, residual)
        attn_output = self.self_attn(normed, cos, sin, cu_seqlen_prefill, kv_cache, slots, seqlen)
        normed, res = self.post_attention_layernorm(attn_output, res)
        return self.mlp(normed), res


class FlashLlamaModel(nn.Module):
    def __init__(self, config, *, device, dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            [FlashLlamaLayer(config, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        )
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, device=device, dtype=dtype)
        head_size = config.hidden_size // config.num_attention_heads
        self.rotary_emb = PositionRotaryEmbedding(head_size, config.rope_theta, device=device)

    def forward(self, input_ids, position_ids, cu_seqlen_prefill, kv_cache: List[KVCache], slots, seqlen, max_s):
        hidden_states = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb.get_cos_sin(position_ids, max_s, hidden_states.dtype)
        residual = None
        for i, layer in enumerate(self.layers):
            hidden_states, residual = layer(
                hidden_states, residual, cos, sin, cu_seqlen_prefill, kv_cache[i], slots, seqlen
            )
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class SpeculativeHead(nn.Module):
    """LM head plus an optional Medusa-style speculator over the same hidden states."""

    def __init__(self, hidden_size: int, vocab_size: int, n_speculative: int, *, device, dtype):
        super().__init__()
        self.head = nn.Linear(hidden_size, vocab_size, bias=False, device=device, dtype=dtype)
        self.speculator = (
            nn.ModuleList(
                [nn.Linear(hidden_size, vocab_size, bias=False, device=device, dtype=dtype) for _ in range(n_speculative)]
            )
            if n_speculative
            else None
        )

    def forward(self, hidden_states: torch.Tensor, lm_head_indices: Optional[torch.Tensor] = None) -> SpeculativeOutput:
        if lm_head_indices is not None:
            # prefill: only the last token of every request goes through the head (int64 gather)
            hidden_states = hidden_states[lm_head_indices]  # ok: FC101
        logits = self.head(hidden_states)
        if self.speculator is None:
            return SpeculativeOutput(logits, None)
        speculative_logits = torch.stack([m(hidden_states) for m in self.speculator], dim=1)
        return SpeculativeOutput(logits, speculative_logits)


class FlashLlamaForCausalLM(nn.Module):
    def __init__(self, config, *, device, dtype, n_speculative: int = 0):
        super().__init__()
        self.config = config
        self.model = FlashLlamaModel(config, device=device, dtype=dtype)
        self.lm_head = SpeculativeHead(
            config.hidden_size, config.vocab_size, n_speculative, device=device, dtype=dtype
        )

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlen_prefill: Optional[torch.Tensor],
        kv_cache: List[KVCache],
        slots: torch.Tensor,
        seqlen: Seqlen,
        max_s: int,
        lm_head_indices: Optional[torch.Tensor] = None,
    ) -> SpeculativeOutput:
        hidden_states = self.model(input_ids, position_ids, cu_seqlen_prefill, kv_cache, slots, seqlen, max_s)
        return self.lm_head(hidden_states, lm_head_indices)
