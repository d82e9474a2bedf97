"""A stand-in GPT-OSS: alternating sliding-window / full attention per DP rank, MoE over all ranks' tokens."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from srt.layers.dp_attention import dp_gather, dp_scatter
from srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from srt.layers.attention.flashinfer_backend import FlashInferDPAttnBackend

logger = logging.getLogger(__name__)


class GptOssDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id: int, backend: "FlashInferDPAttnBackend"):
        super().__init__()
        self.layer_id, self.backend = layer_id, backend
        self.sliding_window_size = cfg.sliding_window if layer_id % 2 == 0 else 0
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        self.splits, self.qkv, self.o_proj = [q, kv, kv], nn.Linear(cfg.hidden_size, q + 2 * kv), nn.Linear(q, cfg.hidden_size)
        self.norm1, self.norm2 = nn.RMSNorm(cfg.hidden_size), nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Linear(cfg.hidden_size, cfg.hidden_size)  # stands in for the TP-sharded experts

    def _moe(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        local = self.norm2(hidden)
        dp_gather(fb.gathered_buffer, local, fb)
        dp_scatter(local, self.mlp(fb.gathered_buffer), fb)
        return hidden + local

    def decode(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, _, _ = self.qkv(self.norm1(hidden)).split(self.splits, dim=-1)
        return self._moe(hidden + self.o_proj(self.backend.forward_decode(q, self, fb).flatten(1)), fb)

    def extend(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(hidden)).split(self.splits, dim=-1)
        return self._moe(hidden + self.o_proj(self.backend.forward_extend(q, k, v, self, fb).flatten(1)), fb)


class GptOssForCausalLM(nn.Module):
    def __init__(self, cfg, backend: "FlashInferDPAttnBackend"):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GptOssDecoderLayer(cfg, i, backend) for i in range(cfg.num_hidden_layers))
        self.norm, self.lm_head = nn.RMSNorm(cfg.hidden_size), nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        logger.debug(f"decode: tokens per DP rank {fb.global_num_tokens_gpu}")  # expect: FC101
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer.decode(hidden, fb)
        return self.lm_head(self.norm(hidden))

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer.extend(hidden, fb)
        return self.lm_head(self.norm(hidden))
