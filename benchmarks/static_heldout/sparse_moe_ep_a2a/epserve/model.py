"""A DeepSeek-shaped decoder: MLA attention, dense first layers, routed experts after that."""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from epserve.config import EPConfig
from epserve.dist.a2a import AllToAllDispatcher
from epserve.layers import MicroBatchAttnBackend, MicroBatchMeta, MLAAttention, MoELayer


class MLAKVPool:
    def __init__(self, cfg: EPConfig, num_pages: int, device: torch.device):
        self.cfg = cfg
        width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
        self.kv = [torch.zeros((num_pages, cfg.page_size, width), dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def layer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        kv = self.kv[layer_id]
        return kv[..., : self.cfg.kv_lora_rank], kv[..., self.cfg.kv_lora_rank :]

    def fused(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id].unsqueeze(1)

    def store(self, layer_id: int, ckv: torch.Tensor, kpe: torch.Tensor, positions: torch.Tensor, meta: MicroBatchMeta) -> None:
        page = meta.block_tables[:, positions // self.cfg.page_size].diagonal()
        slot = positions % self.cfg.page_size
        cache = self.kv[layer_id]
        fused = torch.cat([ckv, kpe], dim=-1)
        cache[page.long(), slot.long()] = fused.to(cache.dtype)


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EPConfig, layer_id: int, backend: MicroBatchAttnBackend, kv_pool: MLAKVPool, dispatcher: AllToAllDispatcher, device):
        super().__init__()
        self.attn = MLAAttention(cfg, layer_id, backend, kv_pool)
        if layer_id < cfg.first_dense_layers:
            self.ffn = DenseMLP(cfg.hidden_size, cfg.moe_intermediate * 9)
        else:
            self.ffn = MoELayer(cfg, dispatcher, device)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, metas: List[MicroBatchMeta]) -> torch.Tensor:
        # attention per micro-batch (each on its own rows of the shared metadata), experts over the whole step
        sizes = [m.batch_size for m in metas]
        parts = []
        for x, pos, meta in zip(self.ln1(h).split(sizes), positions.split(sizes), metas):
            parts.append(self.attn(x, pos, meta))
        h = h + torch.cat(parts, dim=0)
        return h + self.ffn(self.ln2(h))


class EPModel(nn.Module):
    def __init__(self, cfg: EPConfig, backend: MicroBatchAttnBackend, kv_pool: MLAKVPool, dispatcher: AllToAllDispatcher, device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(cfg, i, backend, kv_pool, dispatcher, device) for i in range(cfg.num_layers)]
        )
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, metas: List[MicroBatchMeta]) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, metas)
        return self.lm_head(self.norm(h))
