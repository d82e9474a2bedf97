import logging
from typing import Dict, Optional

import torch
from torch import nn

from tts_attn.backends import DepthAttention
from ttscore.config import TTSConfig

logger = logging.getLogger(__name__)


class DepthLayer(nn.Module):
    def __init__(self, cfg: TTSConfig, attn: DepthAttention):
        super().__init__()
        d = cfg.depth_heads * cfg.depth_head_dim
        self.attn = attn
        self.heads = cfg.depth_heads
        self.hd = cfg.depth_head_dim
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(-1, 3, self.heads, self.hd).unbind(1)
        return x + self.o(self.attn.run_frame(q, k, v).reshape(x.shape[0], -1))


class DepthDecoder(nn.Module):
    """Small transformer that emits the num_codebooks codes of one frame from the backbone's state."""

    def __init__(self, cfg: TTSConfig, attn: DepthAttention, backbone_dim: int):
        super().__init__()
        d = cfg.depth_heads * cfg.depth_head_dim
        self.cfg = cfg
        self.attn = attn
        self.proj = nn.Linear(backbone_dim, d)
        self.code_embed = nn.Embedding(cfg.codebook_size, d)
        self.layers = nn.ModuleList([DepthLayer(cfg, attn) for _ in range(cfg.depth_layers)])
        self.heads = nn.Linear(d, cfg.codebook_size * cfg.num_codebooks, bias=False)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_in: Optional[torch.Tensor] = None
        self.static_out: Dict[int, torch.Tensor] = {}
        self.frames_emitted = torch.zeros(cfg.max_streams, dtype=torch.int64, device=attn.device)
        self.codes_buf = torch.zeros(cfg.max_streams, cfg.num_codebooks, dtype=torch.int64, device=attn.device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        k = self.cfg.num_codebooks
        x = self.proj(h).repeat_interleave(k, dim=0)
        x = x + self.code_embed(self.attn.depth_positions[: x.shape[0]] % k)
        for layer in self.layers:
            x = layer(x)
        logits = self.heads(x).view(h.shape[0], k, k, -1)
        return torch.diagonal(logits, dim1=1, dim2=2).argmax(dim=1)

    def decode_frame(self, h: torch.Tensor, bs: int) -> torch.Tensor:
        n = h.shape[0]
        k = self.cfg.num_codebooks
        self.attn.depth_positions = torch.arange(n * k, device=h.device)  # expect: FC107
        # every frame is a fresh ragged batch: reset the graph's query offsets to the frame starts
        self.attn.frame_qo_indptr_buf[: bs + 1].copy_(self.attn.frame_indptr_gpu[: bs + 1])  # expect: FC104
        if bs in self.graphs:
            self.static_in[:n].copy_(h)
            self.graphs[bs].replay()
            codes = self.static_out[bs][:n]
        else:
            self.attn.plan_frame(n)
            codes = self(h)
        self.frames_emitted[:n] += 1
        total = sum(self.frames_emitted)  # expect: FC101
        logger.debug("depth decoder emitted %s frames so far", total)
        self.codes_buf[:n].copy_(codes)
        return self.codes_buf[:n]
