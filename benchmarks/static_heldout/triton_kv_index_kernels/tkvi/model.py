"""A stand-in Llama whose attention goes through the backend; decode and extend have separate entry points."""

from __future__ import annotations

import torch
from torch import nn

from tkvi.config import ServerArgs
from tkvi.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    """Per-layer attention settings; the computation is the backend's."""

    def __init__(
        self,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        sliding_window_size: int = -1,
        logit_cap: float = 0.0,
        kv_group: int = 0,
        needs_lse: bool = False,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.head_dim = head_dim
        self.scaling = head_dim**-0.5
        self.sliding_window_size = sliding_window_size
        self.logit_cap = logit_cap
        self.kv_group = kv_group
        self.needs_lse = needs_lse
        self.sink_logit = nn.Parameter(torch.zeros(num_heads)) if needs_lse else None

    def merge_sink(self, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """Rescale the attention output for a learned sink logit: o * exp(lse) / (exp(lse) + exp(sink))."""
        scale = torch.sigmoid(lse - self.sink_logit.view(1, -1))
        return o * scale.unsqueeze(-1).to(o.dtype)

    def forward_decode(self, q, k, v, forward_batch: ForwardBatch):
        return forward_batch.attn_backend.forward_decode(q, k, v, self, forward_batch)

    def forward_extend(self, q, k, v, forward_batch: ForwardBatch):
        return forward_batch.attn_backend.forward_extend(q, k, v, self, forward_batch)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, args: ServerArgs, layer_id: int):
        super().__init__()
        hidden = args.hidden_size
        self.num_heads = args.num_attention_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.input_layernorm = nn.RMSNorm(hidden)
        self.qkv_proj = nn.Linear(hidden, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden, bias=False), nn.SiLU(), nn.Linear(4 * hidden, hidden, bias=False)
        )
        self.self_attn = RadixAttention(
            layer_id,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            sliding_window_size=args.sliding_window_size if args.is_sliding_layer(layer_id) else -1,
            logit_cap=args.logit_soft_cap,
            kv_group=args.kv_group_of(layer_id),
            needs_lse=layer_id in args.attention_sink_layers,
        )

    def _qkv(self, hidden: torch.Tensor):
        qkv = self.qkv_proj(self.input_layernorm(hidden))
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        return qkv.split([q_size, kv_size, kv_size], dim=-1)

    def _mlp(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.o_proj(attn_out)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward_decode(self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch):
        q, k, v = self._qkv(hidden)
        return self._mlp(hidden, self.self_attn.forward_decode(q, k, v, forward_batch))

    def forward_extend(self, positions: torch.Tensor, hidden: torch.Tensor, forward_batch: ForwardBatch):
        q, k, v = self._qkv(hidden)
        return self._mlp(hidden, self.self_attn.forward_extend(q, k, v, forward_batch))


class LlamaForCausalLM(nn.Module):
    def __init__(self, args: ServerArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(args, i) for i in range(args.num_layers)])
        self.norm = nn.RMSNorm(args.hidden_size)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch):
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer.forward_decode(positions, hidden, forward_batch)
        return self.lm_head(self.norm(hidden))

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch):
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer.forward_extend(positions, hidden, forward_batch)
        # logits of each request's last new token
        last_index = torch.cumsum(forward_batch.extend_seq_lens, dim=0) - 1
        return self.lm_head(self.norm(hidden[last_index]))
