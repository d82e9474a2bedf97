"""The hybrid: RWKV time-mix blocks (a WKV state per request slot) with a FlashInfer attention block in between."""

from typing import Dict, Optional

import torch
from torch import nn

from rwkvserve import PAGE_SIZE, AttnMeta, HybridConfig
from hyb_attn.backend import HybridAttnBackend, make_attend

class RecurrentStateCache:
    def __init__(self, n_layers: int, slots: int, heads: int, head_dim: int, device: torch.device):
        self.wkv = torch.zeros(n_layers, slots, heads, head_dim, head_dim, device=device)
        self.shift = torch.zeros(n_layers, slots, heads * head_dim, device=device)
        self.capacity = slots

    def grow(self, n_slots: int) -> None:
        assert n_slots > 0, "a step needs at least one state slot"  # expect: FC109
        extra = n_slots - self.capacity
        if extra > 0:
            self.wkv = torch.cat([self.wkv, self.wkv.new_zeros(self.wkv.shape[0], extra, *self.wkv.shape[2:])], 1)  # expect: FC107
            self.shift = torch.cat([self.shift, self.shift.new_zeros(self.shift.shape[0], extra, self.shift.shape[2])], 1)  # expect: FC107
            self.capacity = n_slots

def time_mix(cache: RecurrentStateCache, layer: int, slots: torch.Tensor, r: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # out = r.S; S <- diag(w) S + k^T v
    state = cache.wkv[layer].index_select(0, slots)
    out = torch.einsum("bhd,bhde->bhe", r, state)
    state = state * w.unsqueeze(-1) + torch.einsum("bhd,bhe->bhde", k, v)
    if (state.abs().amax(dim=(-1, -2)) > 1e4).any():  # expect: FC101
        state = state / state.abs().amax(dim=(-1, -2), keepdim=True).clamp_min(1.0)
    cache.wkv[layer].index_copy_(0, slots, state)
    cache.shift[layer].index_copy_(0, slots, x)
    return out

class AttnBlock(nn.Module):
    def __init__(self, cfg: HybridConfig, backend: HybridAttnBackend, layer: int):
        super().__init__()
        self.cfg, self.backend, self.layer = cfg, backend, layer
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.kv_proj = nn.Linear(cfg.hidden, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.fallback = make_attend(backend.decode_fa2) if cfg.head_dim not in (64, 128) else None  # no trtllm-gen kernel

    def decode(self, h: torch.Tensor, meta: AttnMeta, kv: Optional[torch.Tensor], capturing: bool) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        o = self.fallback(q, kv) if self.fallback is not None else self.backend.attend(meta, q, kv, capturing)
        if self.cfg.debug_attn and self.layer == self.cfg.attn_every - 1:  # the first attention layer, against FA2
            self.backend.debug_pairs.append((o, self.backend.decode_fa2.run(q, kv)))  # expect: FC108
        return h + self.o_proj(o.flatten(1))

    def prefill(self, h: torch.Tensor, meta: AttnMeta, kv: Optional[torch.Tensor]) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        if meta.mode == "long":
            o = self.backend.long_prefill.run(q, kv)
        elif meta.mode == "paged":
            o = self.backend.prefill.run(q, kv)  # ok: FC108
        else:
            k, v = self.kv_proj(h).view(h.shape[0], 2, self.cfg.num_kv_heads, -1).unbind(1)
            o = self.backend.ragged.run(q, k, v)  # ok: FC108
        return h + self.o_proj(o.flatten(1))

class RwkvBlock(nn.Module):
    def __init__(self, cfg: HybridConfig, cache: RecurrentStateCache, state_layer: int):
        super().__init__()
        self.cfg, self.cache, self.state_layer = cfg, cache, state_layer
        self.rkvw = nn.Linear(cfg.hidden, 4 * cfg.hidden, bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def _mix(self, h: torch.Tensor):
        r, k, v, w = self.rkvw(h).view(h.shape[0], 4, self.cfg.num_qo_heads, self.cfg.head_dim).unbind(1)
        return r, k, v, torch.sigmoid(w)

    def decode(self, h: torch.Tensor, meta: AttnMeta, kv: Optional[torch.Tensor], capturing: bool) -> torch.Tensor:
        r, k, v, w = self._mix(h)
        return h + self.o_proj(time_mix(self.cache, self.state_layer, meta.state_slots, r, k, v, w, h).flatten(1))

    def prefill(self, h: torch.Tensor, meta: AttnMeta, kv: Optional[torch.Tensor]) -> torch.Tensor:
        r, k, v, w = self._mix(h)
        tok_slots = torch.repeat_interleave(meta.state_slots, meta.qo_indptr.diff(), output_size=h.shape[0])  # ok: FC101
        # token by token: each request's tokens are contiguous, so every slot sees its recurrence in order
        outs = [time_mix(self.cache, self.state_layer, tok_slots[t : t + 1], r[t : t + 1], k[t : t + 1], v[t : t + 1],
                         w[t : t + 1], h[t : t + 1]) for t in range(h.shape[0])]
        return h + self.o_proj(torch.cat(outs).flatten(1))

class HybridModel(nn.Module):
    def __init__(self, cfg: HybridConfig, backend: HybridAttnBackend, cache: RecurrentStateCache, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList([
            AttnBlock(cfg, backend, i) if cfg.is_attn(i) else RwkvBlock(cfg, cache, i - (i + 1) // cfg.attn_every)
            for i in range(cfg.num_layers)])
        shape = (cfg.max_pages, 2, cfg.num_kv_heads, PAGE_SIZE, cfg.head_dim)
        self.kv: Dict[int, torch.Tensor] = {
            i: torch.zeros(shape, dtype=torch.bfloat16, device=device) for i in range(cfg.num_layers) if cfg.is_attn(i)}
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def decode(self, ids: torch.Tensor, meta: AttnMeta, capturing: bool) -> torch.Tensor:
        h = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            h = blk.decode(h, meta, self.kv.get(i), capturing)
        return self.head(h)

    def prefill(self, ids: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        h = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            h = blk.prefill(h, meta, self.kv.get(i))
        return self.head(h[meta.qo_indptr[1:] - 1])
