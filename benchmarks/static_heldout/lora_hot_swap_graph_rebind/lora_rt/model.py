"""A Llama-shaped decoder whose projections add LoRA deltas gathered by slot index."""

from typing import List

import torch
from torch import nn

from loraswap.config import LoRAServeConfig
from loraswap.slots import AdapterSlotTable
from lora_rt.attention import LoRAAttentionBackend
from lora_rt.batch import DecodeStepMeta


class LoRALinear(nn.Module):
    def __init__(self, d_in: int, d_out: int, module: str, layer: int, table: AdapterSlotTable):
        super().__init__()
        self.base = nn.Linear(d_in, d_out, bias=False)
        self.module = module
        self.layer = layer
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        idx = self.table.row_adapter_idx[: x.shape[0]]
        if idx.max() < 0:  # expect: FC101
            return y
        safe = idx.clamp(min=0).long()
        a = self.table.lora_a[self.module][safe, self.layer]  # [n, R, in]
        b = self.table.lora_b[self.module][safe, self.layer]  # [n, out, R]
        xa = torch.einsum("ni,nri->nr", x.to(a.dtype), a)
        delta = torch.einsum("nr,nor->no", xa, b) * self.table.scaling[safe].unsqueeze(-1)
        return y + (delta * (idx >= 0).unsqueeze(-1)).to(y.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LoRAServeConfig, layer: int, table: AdapterSlotTable, backend: LoRAAttentionBackend):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.backend = backend
        d_in, d_qkv = cfg.module_dims("qkv_proj")
        d_o, d_h = cfg.module_dims("o_proj")
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv_proj = LoRALinear(d_in, d_qkv, "qkv_proj", layer, table)
        self.o_proj = LoRALinear(d_o, d_h, "o_proj", layer, table)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.SiLU(),
                                 nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        qkv = self.qkv_proj(self.norm(h))
        q_size = cfg.num_qo_heads * cfg.head_dim
        return qkv[:, :q_size].view(-1, cfg.num_qo_heads, cfg.head_dim)

    def _finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(attn.reshape(h.shape[0], -1))
        return h + self.mlp(h)

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeStepMeta) -> torch.Tensor:
        attn = self.backend.forward_decode(self._q(h), kv_cache, meta)
        return self._finish(h, attn)

    def prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        attn = self.backend.forward_prefill(self._q(h), kv_cache)
        return self._finish(h, attn)


class LoRALlama(nn.Module):
    def __init__(self, cfg: LoRAServeConfig, table: AdapterSlotTable, backend: LoRAAttentionBackend):
        super().__init__()
        self.embed = nn.Embedding(32000, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, table, backend) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, 32000, bias=False)

    def decode_step(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], meta: DecodeStepMeta) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, kv, meta)
        return self.lm_head(h)

    def prefill_step(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor]) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.prefill(h, kv)
        return self.lm_head(h)
