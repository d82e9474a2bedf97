"""A small VLA: SigLIP-style vision tower, a decoder LM over instruction + observation
tokens, and one discrete action token per control step (VQ action tokenizer)."""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from vlapolicy.config import PolicyConfig
from vlapolicy.policy.attention import PolicyAttention


class VisionEncoder(nn.Module):
    """Patch embedding + a few bidirectional blocks; plain SDPA, no paged KV."""

    def __init__(self, cfg: PolicyConfig, depth: int = 4, heads: int = 16):
        super().__init__()
        self.patch = nn.Conv2d(3, cfg.vision_width, kernel_size=14, stride=14)
        self.heads = heads
        self._sm_scale = (cfg.vision_width // heads) ** -0.5
        self.blocks = nn.ModuleList([nn.Linear(cfg.vision_width, 3 * cfg.vision_width) for _ in range(depth)])
        self.out = nn.Linear(cfg.vision_width, cfg.hidden_size)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.patch(frames.float() / 255.0).flatten(2).transpose(1, 2)
        for qkv in self.blocks:
            q, k, v = qkv(x).chunk(3, dim=-1)
            b, n, d = q.shape
            q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, scale=self._sm_scale)
            x = x + a.transpose(1, 2).reshape(b, n, d)
        return self.out(x)


class PolicyBlock(nn.Module):
    def __init__(self, cfg: PolicyConfig, layer_id: int, attn: PolicyAttention):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.GELU(), nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))
        self.kv_cache = torch.empty(0)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.qkv(self.norm1(h))[..., : self.nq * self.hd].reshape(-1, self.nq, self.hd)

    def _out(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))

    def prefill_obs(self, h: torch.Tensor) -> torch.Tensor:
        return self._out(h, self.attn.obs_attend(self._q(h), self.kv_cache))

    def prefill_instruction(self, h: torch.Tensor) -> torch.Tensor:
        return self._out(h, self.attn.instruction_attend(self._q(h), self.kv_cache))

    def decode_step(self, h: torch.Tensor, chunk: int, j: int) -> torch.Tensor:
        return self._out(h, self.attn.decode_step(self._q(h), self.kv_cache, chunk, j))


class VLAPolicy(nn.Module):
    def __init__(self, cfg: PolicyConfig, attn: PolicyAttention):
        super().__init__()
        self.cfg = cfg
        self.encoder = VisionEncoder(cfg)
        self.proprio = nn.Linear(cfg.proprio_dim, cfg.hidden_size)
        self.embed = nn.Embedding(cfg.action_vocab + 32000, cfg.hidden_size)
        self.layers = nn.ModuleList([PolicyBlock(cfg, i, attn) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.action_head = nn.Linear(cfg.hidden_size, cfg.action_vocab, bias=False)
        # VQ codebook: one code per control step
        self.codebook = nn.Parameter(torch.zeros(cfg.action_vocab, cfg.action_dim))

    def attention_scale(self) -> float:
        return self.encoder._sm_scale  # ok: FC103

    def encode(self, frames: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        r, c = frames.shape[:2]
        img = self.encoder(frames.flatten(0, 1)).view(r, c * self.cfg.tokens_per_image, -1)
        return torch.cat([img, self.proprio(proprio)[:, None]], dim=1)

    def prefill_obs(self, obs_tokens: torch.Tensor) -> torch.Tensor:
        h = obs_tokens.flatten(0, 1)
        for layer in self.layers:
            h = layer.prefill_obs(h)
        return h

    def prefill_instruction(self, token_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(token_ids)
        for layer in self.layers:
            h = layer.prefill_instruction(h)
        return h

    def decode_actions(
        self, chunk: int, first_tokens: torch.Tensor, gumbel: torch.Tensor, temperature: torch.Tensor
    ) -> torch.Tensor:
        """Autoregressively sample `chunk` action tokens per robot (graph-capturable)."""
        tok = first_tokens
        out: List[torch.Tensor] = []
        for j in range(chunk):
            h = self.embed(tok)
            for layer in self.layers:
                h = layer.decode_step(h, chunk, j)
            logits = self.action_head(self.norm(h)).float()
            tok = torch.argmax(logits / temperature[:, None] + gumbel[:, j], dim=-1)
            out.append(tok)
        return torch.stack(out, dim=1)

    def detokenize(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.codebook[tokens]

    def bind_kv_caches(self, caches: List[torch.Tensor]) -> None:
        for layer, cache in zip(self.layers, caches):
            layer.kv_cache = cache
