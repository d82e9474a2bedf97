"""Vision adapters: one tower per vision adapter, each with its own projection into the LM."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn as nn
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from mavl import AdapterSpec, RouterConfig, vision_ws_bytes


@dataclass
class ImageInput:
    adapter: str
    patches: torch.Tensor  # pinned [num_patches, patch_dim]
    num_patches: int


class VisionAdapter(nn.Module):
    def __init__(self, spec: AdapterSpec, lm_hidden: int):
        super().__init__()
        self.spec = spec
        self.heads = spec.vision_heads
        self.head_dim = spec.vision_hidden // spec.vision_heads
        self.patch_embed = nn.Linear(spec.patch_dim, spec.vision_hidden)
        self.qkv = nn.Linear(spec.vision_hidden, 3 * spec.vision_hidden)
        self.merge = nn.Linear(spec.vision_hidden * spec.merge, spec.vision_hidden)
        self.proj = nn.Linear(spec.vision_hidden, lm_hidden)

    def forward(self, patches: torch.Tensor, attn: BatchPrefillWithRaggedKVCacheWrapper) -> torch.Tensor:
        x = self.patch_embed(patches)
        q, k, v = self.qkv(x).view(-1, 3, self.heads, self.head_dim).unbind(1)
        x = x + attn.run(q, k, v).reshape(x.shape)
        x = self.merge(x.view(-1, self.spec.vision_hidden * self.spec.merge))
        return self.proj(x)


class VisionRouter:
    def __init__(self, cfg: RouterConfig, specs: List[AdapterSpec], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.vision_workspace = torch.zeros(vision_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.vision_workspace, "NHD")
        self.towers = nn.ModuleDict(
            {s.name: VisionAdapter(s, cfg.hidden_size) for s in specs if s.kind == "vision"}
        ).to(device)

    def encode(self, images: List[ImageInput]) -> Tuple[torch.Tensor, torch.Tensor]:
        groups: Dict[str, List[int]] = defaultdict(list)
        for i, img in enumerate(images):
            groups[img.adapter].append(i)
        token_counts = torch.zeros(len(images), dtype=torch.int32, device=self.device)
        outs = []
        for name, idxs in groups.items():
            tower = self.towers[name]
            spec = tower.spec
            patches = torch.cat([images[i].patches for i in idxs]).to(self.device, non_blocking=True)
            lens_np = np.array([images[i].num_patches for i in idxs], dtype=np.int32)
            cu_patches_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(lens_np)]).astype(np.int32))
            self.ragged.plan(  # ok: FC102
                cu_patches_cpu, cu_patches_cpu, spec.vision_heads, spec.vision_heads,
                spec.vision_hidden // spec.vision_heads, causal=False,
            )
            outs.append(tower(patches, self.ragged))
            for i in idxs:
                token_counts[i] = images[i].num_patches // spec.merge
        return torch.cat(outs), token_counts
