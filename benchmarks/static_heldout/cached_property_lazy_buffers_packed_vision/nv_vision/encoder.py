"""Vision tower over packed native-resolution images: windowed and full attention on FlashInfer's ragged prefill."""

from __future__ import annotations

import functools
import os
from typing import Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from torch import nn

from navit import MERGE_SIZE, PATCH_SIZE, VISION_WS_BYTES
from navit.config import VLMConfig
from navit.lazy import DeviceBuffer
from navit.packing import PackedImages
from navit.tracing import traced


def _window_sizes(grid_thw_cpu: torch.Tensor, window: int) -> np.ndarray:
    """Patches per attention window, windows row-major inside each frame."""
    assert grid_thw_cpu.ndim == 2 and grid_thw_cpu.shape[1] == 3, grid_thw_cpu.shape  # expect: FC109
    sizes = []
    for t, h, w in grid_thw_cpu.tolist():  # ok: FC101
        mh, mw = h // MERGE_SIZE, w // MERGE_SIZE
        rows = [min(window, mh - r) for r in range(0, mh, window)]
        cols = [min(window, mw - c) for c in range(0, mw, window)]
        sizes += [r * c * MERGE_SIZE * MERGE_SIZE for _ in range(t) for r in rows for c in cols]
    return np.asarray(sizes, dtype=np.int32)


def _cu(sizes: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))


def _ragged_capacity(self) -> int:
    return self._qo_indptr_buf.numel() - 1  # expect: FC103


BatchPrefillWithRaggedKVCacheWrapper.batch_capacity = _ragged_capacity


class VisionAttention:
    win_cu_seqlens = DeviceBuffer(lambda s: (s.cfg.max_patches // (MERGE_SIZE * MERGE_SIZE) + 1,))

    def __init__(self, cfg: VLMConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.heads, self.hd = cfg.vision_heads, cfg.vision_head_dim
        self.window = cfg.window_size // PATCH_SIZE // MERGE_SIZE
        self.full_ws = torch.empty(int(os.environ.get("NAVIT_FULLATT_WS_MB", "256")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.full_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.full_ws, "NHD")
        self.window_eager = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self.window_graph: Optional[BatchPrefillWithRaggedKVCacheWrapper] = None
        self.frame_cu: Optional[torch.Tensor] = None
        self.graph_mode = False

    @functools.cached_property
    def workspace(self) -> torch.Tensor:
        return torch.empty(VISION_WS_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106

    @traced("vision.plan")
    def plan(self, packed: PackedImages) -> None:
        if packed.max_seqlen > self.cfg.max_patches:
            raise ValueError(f"an image exceeds {self.cfg.max_patches} patches: {packed.cu_seqlens}")  # ok: FC101
        frames = torch.repeat_interleave(packed.grid_thw[:, 1] * packed.grid_thw[:, 2], packed.grid_thw[:, 0])  # expect: FC101
        if self.frame_cu is None:
            self.frame_cu = torch.zeros(self.cfg.max_patches + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        n = frames.numel()
        torch.cumsum(frames, 0, out=self.frame_cu[1 : n + 1])
        self.full_wrapper.plan(self.frame_cu[: n + 1], self.frame_cu[: n + 1], self.heads, self.heads, self.hd, causal=False)  # expect: FC102
        cu_win_cpu = _cu(_window_sizes(packed.grid_thw_cpu, self.window))
        self.window_eager.plan(cu_win_cpu, cu_win_cpu, self.heads, self.heads, self.hd, causal=False)  # ok: FC102
        self.win_cu_seqlens[: cu_win_cpu.numel()].copy_(cu_win_cpu, non_blocking=True)  # expect: FC104

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, full: bool) -> torch.Tensor:
        if full:
            return self.full_wrapper.run(q, k, v)  # expect: FC108
        w = self.window_graph if self.graph_mode else self.window_eager
        return w.run(q, k, v)  # ok: FC108


def _rope2d(x: torch.Tensor, pos: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    quarter = x.shape[-1] // 4
    inv = theta ** (-torch.arange(quarter, device=x.device, dtype=torch.float32) / quarter)
    ang = torch.cat([pos[:, :1] * inv, pos[:, 1:] * inv], dim=-1)[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1).to(x.dtype)


class VisionBlock(nn.Module):
    def __init__(self, cfg: VLMConfig):
        super().__init__()
        d, self.heads, self.hd = cfg.vision_hidden, cfg.vision_heads, cfg.vision_head_dim
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, attn: VisionAttention, full: bool) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).view(-1, 3, self.heads, self.hd).unbind(1)
        x = x + self.proj(attn.forward(_rope2d(q, pos), _rope2d(k, pos), v, full).reshape(x.shape[0], -1))
        return x + self.mlp(self.norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VLMConfig, device: torch.device):
        super().__init__()
        self.cfg, self.attn = cfg, VisionAttention(cfg, device)
        self.patch_embed = nn.Linear(3 * PATCH_SIZE * PATCH_SIZE, cfg.vision_hidden, bias=False)
        self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.vision_depth)])
        self.full_blocks = frozenset(cfg.fullatt_blocks)
        self.merger = nn.Linear(cfg.vision_hidden * MERGE_SIZE * MERGE_SIZE, cfg.hidden, bias=False)

    def rot_pos_ids(self, packed: PackedImages) -> None:
        ids = []
        for t, h, w in packed.grid_thw.tolist():  # expect: FC101
            hpos = torch.arange(h, device=packed.patches.device).view(-1, 1).expand(h, w)
            wpos = torch.arange(w, device=packed.patches.device).view(1, -1).expand(h, w)
            ids.append(torch.stack([hpos, wpos], dim=-1).reshape(-1, 2).repeat(t, 1))
        packed.pos_ids = torch.cat(ids)  # ok: FC107

    def encode_patches(self, packed: PackedImages) -> torch.Tensor:
        x = self.patch_embed(packed.patches)
        for i, blk in enumerate(self.blocks):
            x = blk(x, packed.pos_ids, self.attn, full=i in self.full_blocks)
        return self.merger(x.view(-1, self.cfg.vision_hidden * MERGE_SIZE * MERGE_SIZE))

    @traced("vision.encode", sync=True)
    def forward(self, packed: PackedImages) -> torch.Tensor:
        assert packed.patches.shape[0] == packed.num_patches, "patches and grid disagree"  # expect: FC109
        self.rot_pos_ids(packed)
        self.attn.plan(packed)
        return self.encode_patches(packed)


class EncoderGraphs:
    """One graph for the thumbnail tier: `n` images on a fixed `h x w` patch grid."""

    def __init__(self, encoder: VisionEncoder, n: int, h: int, w: int):
        self.encoder, self.attn = encoder, encoder.attn
        self.n, self.h, self.w = n, h, w
        self.grid_cpu = torch.tensor([[1, h, w]] * n, dtype=torch.int32)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.static: Optional[PackedImages] = None
        self.out: Optional[torch.Tensor] = None

    def matches(self, packed: PackedImages) -> bool:
        return self.graph is not None and torch.equal(packed.grid_thw_cpu, self.grid_cpu)  # ok: FC101

    def capture_grid(self) -> None:
        attn, dev = self.attn, self.attn.device
        cu_cpu = torch.arange(self.n + 1, dtype=torch.int32) * (self.h * self.w)
        patches = torch.zeros(self.n * self.h * self.w, 3 * PATCH_SIZE * PATCH_SIZE, device=dev)
        self.static = PackedImages(patches, self.grid_cpu.to(dev), self.grid_cpu, cu_cpu.to(dev), cu_cpu)
        self.encoder.rot_pos_ids(self.static)
        cu_win_cpu = _cu(_window_sizes(self.grid_cpu, attn.window))
        n_win = cu_win_cpu.numel()
        attn.win_cu_seqlens[:n_win].copy_(cu_win_cpu)  # ok: FC104
        graph_ws = torch.empty(self.encoder.cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC106
        attn.window_graph = BatchPrefillWithRaggedKVCacheWrapper(
            graph_ws, "NHD", use_cuda_graph=True, qo_indptr_buf=attn.win_cu_seqlens[:n_win], kv_indptr_buf=attn.win_cu_seqlens[:n_win])
        attn.window_graph.plan(cu_win_cpu, cu_win_cpu, attn.heads, attn.heads, attn.hd, causal=False)  # ok: FC102
        attn.full_wrapper.plan(cu_cpu, cu_cpu, attn.heads, attn.heads, attn.hd, causal=False)  # ok: FC102
        tokens = int(self.static.tokens_per_image.sum())  # expect: FC101
        self.out = torch.empty(tokens, self.encoder.cfg.hidden, dtype=torch.bfloat16, device=dev)
        torch.cuda.synchronize()  # ok: FC101
        self.graph, attn.graph_mode = torch.cuda.CUDAGraph(), True
        with torch.cuda.graph(self.graph):
            self.out.copy_(self.encoder.encode_patches(self.static))
        attn.graph_mode = False

    def describe(self) -> str:
        backend = vars(self.attn.full_wrapper).get("_backend", "auto")  # expect: FC103
        return f"{self.n}x{self.h}x{self.w} patches, {self.attn.window_graph.batch_capacity()} windows, full attention on {backend}"

    def replay(self, packed: PackedImages) -> torch.Tensor:
        assert self.graph is not None, "capture_grid() has not run"  # ok: FC109
        self.static.patches = packed.patches.clone()  # expect: FC107
        self.graph.replay()
        return self.out
