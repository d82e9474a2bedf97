"""The vision tower: a ViT over each frame's patches (frames are the ragged sequences), pooled to
``tokens_per_frame`` tokens; one CUDA graph per chunk-size bucket."""
from typing import Dict, Tuple

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from torch import nn

from vs_attn.workspace import vision_workspace
from vstream import VideoStreamConfig


class VisionAttention:
    def __init__(self, cfg: VideoStreamConfig):
        self.cfg = cfg
        self.heads = cfg.vision_heads
        self.head_dim = cfg.vision_hidden // cfg.vision_heads
        self._backend = "fa2"  # ok: FC103
        self.wrapper = BatchPrefillWithRaggedKVCacheWrapper(vision_workspace(cfg), "NHD", backend=self._backend)

    def plan_frames(self, nf: int) -> None:
        indptr = torch.arange(nf + 1, dtype=torch.int32) * self.cfg.patches_per_frame
        self.wrapper.plan(indptr, indptr, self.heads, self.heads, self.head_dim, causal=False, q_data_type=torch.bfloat16)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, k, v)  # expect: FC108


class VisionBlock(nn.Module):
    def __init__(self, cfg: VideoStreamConfig, attn: VisionAttention):
        super().__init__()
        self.attn = attn
        self.norm = nn.LayerNorm(cfg.vision_hidden)
        self.qkv = nn.Linear(cfg.vision_hidden, 3 * cfg.vision_hidden)
        self.proj = nn.Linear(cfg.vision_hidden, cfg.vision_hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.vision_hidden, 4 * cfg.vision_hidden), nn.GELU(), nn.Linear(4 * cfg.vision_hidden, cfg.vision_hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).view(x.shape[0], 3, self.attn.heads, self.attn.head_dim).unbind(1)
        x = x + self.proj(self.attn(q, k, v).flatten(1))
        return x + self.mlp(x)


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VideoStreamConfig, chunk_buckets: Tuple[int, ...]):
        super().__init__()
        assert list(chunk_buckets) == sorted(chunk_buckets), "vision buckets must be ascending"  # expect: FC109
        self.cfg = cfg
        self.chunk_buckets = chunk_buckets
        self.patch_embed = nn.Conv2d(3, cfg.vision_hidden, cfg.patch, cfg.patch)
        self.attn = VisionAttention(cfg)
        self.blocks = nn.ModuleList([VisionBlock(cfg, self.attn) for _ in range(cfg.vision_layers)])
        self.out_proj = nn.Linear(cfg.vision_hidden, cfg.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        nf = pixels.shape[0]
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2).reshape(-1, self.cfg.vision_hidden)
        for blk in self.blocks:
            x = blk(x)
        pooled = x.view(nf, self.cfg.tokens_per_frame, -1, self.cfg.vision_hidden).mean(2)
        return self.out_proj(pooled)


class VisionGraphRunner:
    def __init__(self, encoder: VisionEncoder, cfg: VideoStreamConfig, device: torch.device):
        self.encoder = encoder
        self.static_pixels = torch.zeros(
            max(cfg.frame_buckets), 3, cfg.image_size, cfg.image_size, dtype=torch.bfloat16, device=device
        )
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}

    def record_bucket(self, nf: int) -> None:
        self.encoder.attn.plan_frames(nf)
        pixels = self.static_pixels[:nf]
        self.encoder(pixels)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs[nf] = self.encoder(pixels)
        torch.cuda.synchronize()  # ok: FC101
        self.graphs[nf] = graph

    def encode(self, pixels_cpu: torch.Tensor) -> torch.Tensor:
        nf = pixels_cpu.shape[0]
        bucket = min(b for b in self.graphs if b >= nf)
        self.static_pixels[:nf].copy_(pixels_cpu, non_blocking=True)  # ok: FC104
        self.encoder.attn.plan_frames(bucket)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:nf]
