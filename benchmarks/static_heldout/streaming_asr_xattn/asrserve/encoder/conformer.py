"""Chunked streaming Conformer: each 40 ms chunk attends to itself and a left context of earlier frames."""

from __future__ import annotations

from typing import List

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper


class ConformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kernel: int = 15):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ff1 = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))
        self.ff2 = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))
        self.conv = nn.Conv1d(dim, dim, kernel, groups=dim, padding=kernel - 1)
        self.norm = nn.LayerNorm(dim)


class StreamingEncoder(nn.Module):
    def __init__(self, settings, device: torch.device):
        super().__init__()
        self.settings = settings
        self.device = device
        self.heads = settings.enc_heads
        self.head_dim = settings.enc_dim // settings.enc_heads
        self._sm_scale = self.head_dim ** -0.5
        self.chunk_workspace = torch.empty(settings.encoder_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.chunk_attn = BatchPrefillWithRaggedKVCacheWrapper(self.chunk_workspace, "NHD", backend="fa2")
        self.subsample = nn.Conv1d(settings.n_mels, settings.enc_dim, kernel_size=settings.subsampling, stride=settings.subsampling)
        self.blocks = nn.ModuleList([ConformerBlock(settings.enc_dim, settings.enc_heads) for _ in range(settings.enc_layers)])
        ctx = settings.left_context_frames
        shape = (settings.enc_layers, settings.max_streams, ctx, 2, settings.enc_heads, self.head_dim)
        self.ctx_kv = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self.ctx_lens_np = np.zeros(settings.max_streams, dtype=np.int32)

    def plan_chunks(self, chunk_lens_np: np.ndarray, ctx_lens_np: np.ndarray) -> torch.Tensor:
        n = len(chunk_lens_np)
        qo_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(chunk_lens_np, out=qo_np[1:])
        kv_np = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(chunk_lens_np + ctx_lens_np, out=kv_np[1:])
        qo_indptr = torch.from_numpy(qo_np)
        # the context gather below reads kv_indptr on the device as well
        kv_indptr = torch.from_numpy(kv_np).to(self.device, non_blocking=True)
        scale = self._sm_scale  # ok: FC103
        self.chunk_attn.plan(qo_indptr, kv_indptr, self.heads, self.heads, self.head_dim, causal=False, sm_scale=scale)  # expect: FC102
        return kv_indptr

    def _gather_context(self, layer: int, rows: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, ctx_len: int):
        ctx = self.ctx_kv[layer, rows, -ctx_len:] if ctx_len else self.ctx_kv[layer, rows, :0]
        k = torch.cat([ctx[:, :, 0], k_new], dim=1).flatten(0, 1)
        v = torch.cat([ctx[:, :, 1], v_new], dim=1).flatten(0, 1)
        return k, v

    def encode_chunks(self, feats: List[np.ndarray], rows_np: np.ndarray) -> torch.Tensor:
        """One 40 ms chunk per stream in ``rows_np``; returns the new encoder frames, [n, frames, enc_dim]."""
        n = len(rows_np)
        x = torch.from_numpy(np.stack(feats)).to(self.device, non_blocking=True)
        x = self.subsample(x.transpose(1, 2)).transpose(1, 2)
        f = x.shape[1]
        ctx_len = int(self.ctx_lens_np[rows_np].min())
        self.plan_chunks(np.full(n, f, dtype=np.int32), np.full(n, ctx_len, dtype=np.int32))
        rows = torch.from_numpy(rows_np).to(self.device, non_blocking=True)
        for i, blk in enumerate(self.blocks):
            x = x + 0.5 * blk.ff1(x)
            q, k, v = blk.qkv(x).view(n, f, 3, self.heads, self.head_dim).unbind(2)
            kk, vv = self._gather_context(i, rows, k.to(torch.bfloat16), v.to(torch.bfloat16), ctx_len)
            attn = self.chunk_attn.run(q.reshape(n * f, self.heads, self.head_dim).to(torch.bfloat16), kk, vv)
            x = x + blk.out(attn.view(n, f, -1).to(x.dtype))
            conv = blk.conv(x.transpose(1, 2))[..., :f].transpose(1, 2)
            x = blk.norm(x + F.silu(conv) + 0.5 * blk.ff2(x))
            self.ctx_kv[i, rows] = torch.roll(self.ctx_kv[i, rows], -f, dims=1)
            self.ctx_kv[i, rows, -f:, 0] = k.to(torch.bfloat16)
            self.ctx_kv[i, rows, -f:, 1] = v.to(torch.bfloat16)
        self.ctx_lens_np[rows_np] = np.minimum(self.ctx_lens_np[rows_np] + f, self.settings.left_context_frames)
        return x
