"""Audio and vision encoders; each owns a ragged prefill wrapper and its workspace (never captured)."""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from torch import nn

from omni import EncoderConfig


@dataclass
class AudioEmbeds:
    embeds: torch.Tensor  # [tokens, hidden], device
    token_counts: torch.Tensor  # device, tokens per clip


def expand_placeholders(pad_id: int, counts: torch.Tensor) -> torch.Tensor:
    """One placeholder id per encoder token of each item."""
    ids = torch.full((counts.numel(),), pad_id, dtype=torch.long, device=counts.device)
    return torch.repeat_interleave(ids, counts)  # expect: FC101


def _check_grid(grid_thw: np.ndarray, merge: int) -> None:
    assert grid_thw.ndim == 2 and grid_thw.shape[1] == 3, "grid_thw is [images, 3]"  # expect: FC109
    if (grid_thw[:, 1:] % merge).any():
        raise ValueError(f"patch grid {grid_thw.tolist()} not divisible by the merge size {merge}")


class _EncoderBlock(nn.Module):
    def __init__(self, ec: EncoderConfig):
        super().__init__()
        hidden = ec.num_heads * ec.head_dim
        self.ec = ec
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, wrapper: BatchPrefillWithRaggedKVCacheWrapper) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.ec.num_heads, self.ec.head_dim).unbind(1)
        return x + self.proj(wrapper.run(q, k, v).reshape(x.shape[0], -1))


class AudioEncoder(nn.Module):
    def __init__(self, ec: EncoderConfig, device: torch.device):
        super().__init__()
        self.ec = ec
        self.device = device
        ws = torch.empty(ec.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        self.conv = nn.Conv1d(128, ec.num_heads * ec.head_dim, kernel_size=3, stride=2, padding=1)
        self.blocks = nn.ModuleList([_EncoderBlock(ec) for _ in range(ec.num_layers)])

    def encode(self, features: torch.Tensor, feat_lens_cpu: np.ndarray) -> AudioEmbeds:
        out_lens_cpu = (feat_lens_cpu - 1) // 2 + 1
        cu_np = np.zeros(len(out_lens_cpu) + 1, dtype=np.int32)
        np.cumsum(out_lens_cpu, out=cu_np[1:])
        cu_host = torch.from_numpy(cu_np).pin_memory()
        self.ragged.plan(cu_host, cu_host, self.ec.num_heads, self.ec.num_heads, self.ec.head_dim)  # ok: FC102
        x = self.conv(features.transpose(0, 1)).transpose(0, 1)
        for blk in self.blocks:
            x = blk(x, self.ragged)
        counts = torch.as_tensor(out_lens_cpu, device=self.device)
        return AudioEmbeds(embeds=x, token_counts=counts)


class VisionEncoder(nn.Module):
    def __init__(self, ec: EncoderConfig, device: torch.device, image_pad_id: int):
        super().__init__()
        self.ec = ec
        self.device = device
        self.image_pad_id = image_pad_id
        ws = torch.empty(ec.workspace_bytes(), dtype=torch.uint8, device=device)
        self.vit_prefill = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        self.patch = nn.Linear(3 * 2 * 14 * 14, ec.num_heads * ec.head_dim)
        self.blocks = nn.ModuleList([_EncoderBlock(ec) for _ in range(ec.num_layers)])

    def encode(self, pixels: torch.Tensor, grid_thw: np.ndarray):
        _check_grid(grid_thw, self.ec.spatial_merge)
        grid = torch.as_tensor(grid_thw, device=self.device)
        cu = F.pad(torch.cumsum(grid.prod(-1), 0), (1, 0)).to(torch.int32)
        self.vit_prefill.plan(cu, cu, self.ec.num_heads, self.ec.num_heads, self.ec.head_dim)  # expect: FC102
        x = self.patch(pixels)
        for blk in self.blocks:
            x = blk(x, self.vit_prefill)
        merged_counts_cpu = grid_thw.prod(-1) // (self.ec.spatial_merge**2)
        total = int(merged_counts_cpu.sum())
        counts = torch.as_tensor(merged_counts_cpu, device=self.device)
        pad = torch.full((counts.numel(),), self.image_pad_id, dtype=torch.long, device=self.device)
        ids = torch.repeat_interleave(pad, counts, output_size=total)  # ok: FC101
        return x, ids
