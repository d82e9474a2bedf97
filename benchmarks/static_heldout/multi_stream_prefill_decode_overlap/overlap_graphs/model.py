"""A Llama-shaped decoder; attention calls go to the lane that owns the stream."""

import flashinfer
import torch
from torch import nn

from overlap import OverlapConfig
from overlap_attn.lanes import DecodeLane, PrefillLane


class OverlapLayer(nn.Module):
    def __init__(self, cfg: OverlapConfig, layer_id: int, prefill_lane: PrefillLane, decode_lane: DecodeLane):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.prefill_lane = prefill_lane
        self.decode_lane = decode_lane
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.sizes = (q_size, kv_size, kv_size)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def _q(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, _ = self.qkv(self.norm(h)).split(self.sizes, dim=-1)
        c = self.cfg
        q, _ = flashinfer.apply_rope_pos_ids(
            q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), positions
        )
        return q

    def decode(self, h, positions, kv_cache, bs: int):
        o = self.decode_lane.attend(self._q(h, positions), kv_cache[self.layer_id], bs)
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def decode_eager(self, h, positions, kv_cache):
        o = self.decode_lane.attend_eager(self._q(h, positions), kv_cache[self.layer_id])
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def prefill(self, h, positions, kv_cache):
        o = self.prefill_lane.attend(self._q(h, positions), kv_cache[self.layer_id])
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class OverlapModel(nn.Module):
    def __init__(self, cfg: OverlapConfig, prefill_lane: PrefillLane, decode_lane: DecodeLane):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [OverlapLayer(cfg, i, prefill_lane, decode_lane) for i in range(cfg.num_layers)]
        )
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, tokens, positions, kv_cache, bs: int):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.decode(h, positions, kv_cache, bs)
        return self.lm_head(self.norm(h))

    def decode_eager(self, tokens, positions, kv_cache):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.decode_eager(h, positions, kv_cache)
        return self.lm_head(self.norm(h))

    def prefill(self, tokens, positions, kv_cache, scratch: torch.Tensor):
        # the residual stream lives in a block of the stream-aware pool
        torch.index_select(self.embed.weight, 0, tokens, out=scratch)
        h = scratch
        for layer in self.layers:
            h = layer.prefill(h, positions, kv_cache)
        return self.lm_head(self.norm(h))
