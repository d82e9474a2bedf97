"""A Gemma-3-shaped decoder: three of every four layers slide over a window, the fourth is global."""

from __future__ import annotations

import torch
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from hyb_srt.attn_backend import HybridAttnBackend
from swahybrid.config import HybridConfig, LayerKind, layer_kinds
from swahybrid.metadata import ForwardBatch
from swahybrid.pools import TwoPools


class HybridLayer(nn.Module):
    def __init__(
        self, cfg: HybridConfig, layer_id: int, kind: LayerKind, backend: HybridAttnBackend, pools: TwoPools
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.kind = kind
        self.backend = backend
        self.pools = pools
        self.hq, self.hkv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.rope_theta = 10000.0 if kind is LayerKind.SWA else 1000000.0
        self.pre = nn.RMSNorm(cfg.hidden_size)
        self.post = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.hq + 2 * self.hkv) * self.d, bias=False)
        self.o = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)
        self.mlp_in = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.mlp_out = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, fb: ForwardBatch, decode: bool):
        q, k, v = self.qkv(self.pre(h)).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = q.view(-1, self.hq, self.d)
        k = k.view(-1, self.hkv, self.d)
        v = v.view(-1, self.hkv, self.d)
        pos = fb.positions
        if decode and self.kind is LayerKind.SWA and fb.window_start is not None:
            pos = pos - fb.window_start
        q, k = apply_rope_pos_ids(q, k, pos, rope_theta=self.rope_theta)
        self.pools.write_kv(self.layer_id, k, v, fb.full_loc, fb.swa_loc)
        return q

    def _mlp(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + self.o(attn.reshape(-1, self.hq * self.d))
        gate, up = self.mlp_in(self.post(h)).chunk(2, dim=-1)
        return h + self.mlp_out(torch.nn.functional.gelu(gate, approximate="tanh") * up)

    def forward_decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q = self._qkv(h, fb, decode=True)
        return self._mlp(h, self.backend.forward_decode(q, self.layer_id, fb))

    def forward_extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q = self._qkv(h, fb, decode=False)
        return self._mlp(h, self.backend.forward_extend(q, self.layer_id, fb))


class HybridLM(nn.Module):
    def __init__(self, cfg: HybridConfig, backend: HybridAttnBackend, pools: TwoPools) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        kinds = layer_kinds(cfg.num_layers, cfg.full_every)
        self.layers = nn.ModuleList([HybridLayer(cfg, i, kind, backend, pools) for i, kind in enumerate(kinds)])
        self.norm = nn.RMSNorm(cfg.hidden_size)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h) @ self.embed.weight.t()

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, fb)
        return self.logits(h)

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, fb)
        last = torch.from_numpy(fb.qo_indptr_cpu.numpy()[1:] - 1).to(h.device, non_blocking=True)
        return self.logits(h.index_select(0, last.long()))
