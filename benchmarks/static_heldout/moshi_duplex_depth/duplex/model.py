"""Temporal transformer (one step per frame, all sessions) and depth transformer (one step per codebook)."""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from duplex.attention.depth import DepthAttnState
from duplex.attention.temporal import TemporalAttnState
from duplex.settings import DuplexSettings


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = pos.float()[:, None] * inv
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


class TemporalLayer(nn.Module):
    def __init__(self, s: DuplexSettings, layer_id: int, state: TemporalAttnState, cache: torch.Tensor):
        super().__init__()
        self.s = s
        self.layer_id = layer_id
        self.state = state
        self.cache = cache
        self.norm1 = nn.RMSNorm(s.temporal_hidden)
        self.norm2 = nn.RMSNorm(s.temporal_hidden)
        self.qkv = nn.Linear(s.temporal_hidden, (s.temporal_heads + 2 * s.temporal_kv_heads) * s.head_dim, bias=False)
        self.o = nn.Linear(s.temporal_heads * s.head_dim, s.temporal_hidden, bias=False)
        self.ff = nn.Sequential(nn.Linear(s.temporal_hidden, 11264), nn.GELU(), nn.Linear(11264, s.temporal_hidden))

    def forward(self, h: torch.Tensor, frames: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        s = self.s
        q, k, v = self.qkv(self.norm1(h)).split(
            [s.temporal_heads * s.head_dim, s.temporal_kv_heads * s.head_dim, s.temporal_kv_heads * s.head_dim], dim=-1
        )
        q = _rope(q.view(-1, s.temporal_heads, s.head_dim), frames)
        k = _rope(k.view(-1, s.temporal_kv_heads, s.head_dim), frames)
        ring = frames % (s.pages_per_session * s.page_size)
        page = slots * s.pages_per_session + ring // s.page_size
        self.cache[page, 0, ring % s.page_size] = k
        self.cache[page, 1, ring % s.page_size] = v.view(-1, s.temporal_kv_heads, s.head_dim)
        h = h + self.o(self.state.run(q, self.cache).reshape(h.shape[0], -1))
        return h + self.ff(self.norm2(h))


class DepthLayer(nn.Module):
    def __init__(self, s: DuplexSettings, layer_id: int, state: DepthAttnState):
        super().__init__()
        self.s = s
        self.layer_id = layer_id
        self.state = state
        d = s.depth_heads * s.depth_head_dim
        self.norm = nn.RMSNorm(s.depth_hidden)
        self.qkv = nn.Linear(s.depth_hidden, 3 * d, bias=False)
        self.o = nn.Linear(d, s.depth_hidden, bias=False)
        self.ff = nn.Sequential(nn.Linear(s.depth_hidden, 4096), nn.GELU(), nn.Linear(4096, s.depth_hidden))

    def forward(self, h: torch.Tensor, step: int, rows: torch.Tensor) -> torch.Tensor:
        s = self.s
        q, k, v = self.qkv(self.norm(h)).view(-1, 3, s.depth_heads, s.depth_head_dim).unbind(1)
        cache = self.state.caches[self.layer_id]
        cache[rows, 0, step] = k
        cache[rows, 1, step] = v
        if step == 0:
            o = self.state.semantic_attn.run(q, k, v)  # expect: FC108
        else:
            o = self.state.current_steps[step].run(q, cache)
        h = h + self.o(o.reshape(h.shape[0], -1))
        return h + self.ff(h)


class DepthTransformer(nn.Module):
    def __init__(self, s: DuplexSettings, state: DepthAttnState):
        super().__init__()
        self.s = s
        self.in_proj = nn.Linear(s.temporal_hidden, s.depth_hidden, bias=False)
        self.text_emb = nn.Embedding(s.text_vocab, s.depth_hidden)
        self.code_emb = nn.ModuleList([nn.Embedding(s.audio_vocab + 1, s.depth_hidden) for _ in range(s.num_codebooks)])
        self.layers = nn.ModuleList([DepthLayer(s, i, state) for i in range(s.depth_layers)])
        self.heads = nn.ModuleList([nn.Linear(s.depth_hidden, s.audio_vocab, bias=False) for _ in range(s.num_codebooks)])
        self.silent_frames = 0

    def generate_frame(self, ctx: torch.Tensor, text: torch.Tensor, rows: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        x = self.in_proj(ctx) + self.text_emb(text)
        codes: List[torch.Tensor] = []
        for k in range(self.s.num_codebooks):
            h = x
            for layer in self.layers:
                h = layer(h, k, rows)
            logits = self.heads[k](h).float()
            code = (logits + noise[:, k]).argmax(dim=-1)  # Gumbel-max sampling, noise drawn per frame
            codes.append(code)
            x = self.code_emb[k](code)
        out = torch.stack(codes, dim=1)
        if (out[:, 0] == self.s.audio_pad - 1).all():  # expect: FC101
            self.silent_frames += 1
        return out


class DuplexLM(nn.Module):
    def __init__(self, s: DuplexSettings, temporal: TemporalAttnState, depth: DepthAttnState, device: torch.device):
        super().__init__()
        self.s = s
        shape = (s.max_sessions * s.pages_per_session, 2, s.page_size, s.temporal_kv_heads, s.head_dim)
        self.caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(s.temporal_layers)]
        self.user_emb = nn.ModuleList([nn.Embedding(s.audio_vocab + 1, s.temporal_hidden) for _ in range(s.num_codebooks)])
        self.model_emb = nn.ModuleList([nn.Embedding(s.audio_vocab + 1, s.temporal_hidden) for _ in range(s.num_codebooks)])
        self.text_emb = nn.Embedding(s.text_vocab, s.temporal_hidden)
        self.layers = nn.ModuleList([TemporalLayer(s, i, temporal, self.caches[i]) for i in range(s.temporal_layers)])
        self.norm = nn.RMSNorm(s.temporal_hidden)
        self.text_head = nn.Linear(s.temporal_hidden, s.text_vocab, bias=False)
        self.depth = DepthTransformer(s, depth)
        delays = torch.tensor([0] + [s.acoustic_delay] * (s.num_codebooks - 1), dtype=torch.int64)
        self.register_buffer("delays", delays, persistent=False)

    def frame_step(
        self,
        user_codes: torch.Tensor,
        prev_codes: torch.Tensor,
        prev_text: torch.Tensor,
        frames: torch.Tensor,
        slots: torch.Tensor,
        rows: torch.Tensor,
        noise: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        s = self.s
        delayed = frames[:, None] < self.delays[None, :]
        prev_codes = torch.where(delayed, torch.full_like(prev_codes, s.audio_pad), prev_codes)  # ok: FC101
        h = self.text_emb(prev_text)
        for k in range(s.num_codebooks):
            h = h + self.user_emb[k](user_codes[:, k]) + self.model_emb[k](prev_codes[:, k])
        for layer in self.layers:
            h = layer(h, frames, slots)
        h = self.norm(h)
        text = self.text_head(h).argmax(dim=-1)
        codes = self.depth.generate_frame(h, text, rows, noise)
        return text, codes
