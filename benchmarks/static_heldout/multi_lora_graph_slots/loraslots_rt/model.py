"""A Llama-shaped decoder whose output projection carries the per-slot LoRA."""

from __future__ import annotations

import torch
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from loraslots.config import SlotConfig
from loraslots.kvpool import PagePool
from loraslots.lora_ops import SlotLoraOps
from loraslots_rt.attention import LoraSlotAttention
from loraslots_rt.batch import PrefillBatch


class LoraDecoderLayer(nn.Module):
    def __init__(
        self, cfg: SlotConfig, layer_id: int, attn: LoraSlotAttention, lora: SlotLoraOps, pool: PagePool
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.lora = lora
        self.pool = pool
        self.hq, self.hkv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.hq + 2 * self.hkv) * self.d, bias=False)
        self.o_proj = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)
        self.up = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(self.norm1(h)).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = q.reshape(-1, self.hq, self.d)
        k = k.reshape(-1, self.hkv, self.d)
        v = v.reshape(-1, self.hkv, self.d)
        q, k = apply_rope_pos_ids(q, k, positions)
        return q, k, v

    def _finish(self, h: torch.Tensor, o: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        o = o.reshape(-1, self.hq * self.d)
        h = h + self.lora.apply(self.layer_id, o, self.o_proj(o), slot_ids)
        return h + self.down(torch.nn.functional.silu(self.up(self.norm2(h))))

    def forward_decode(self, h, positions, slot_ids, out_loc, bs: int) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        self.pool.write_kv(self.layer_id, k, v, out_loc)
        return self._finish(h, self.attn.forward_decode(self.layer_id, q, bs), slot_ids)

    def forward_prefill(self, h: torch.Tensor, pb: PrefillBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, pb.positions)
        self.pool.write_kv(self.layer_id, k, v, pb.out_loc)
        return self._finish(h, self.attn.forward_prefill(q, k, v), pb.slot_ids)


class LoraLM(nn.Module):
    def __init__(self, cfg: SlotConfig, attn: LoraSlotAttention, lora: SlotLoraOps, pool: PagePool) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LoraDecoderLayer(cfg, i, attn, lora, pool) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids, positions, slot_ids, out_loc, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, slot_ids, out_loc, bs)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, pb: PrefillBatch) -> torch.Tensor:
        h = self.embed(pb.input_ids)
        for layer in self.layers:
            h = layer.forward_prefill(h, pb)
        return self.lm_head(self.norm(h.index_select(0, pb.last_token_rows)))
