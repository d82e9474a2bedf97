"""Non-causal ViT attention over the patches of a step's images: full blocks and Qwen2.5-VL windows."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper


class VisionAttentionPlanner:
    def __init__(self, workspace: torch.Tensor, window_workspace: torch.Tensor, vision_config, device: torch.device) -> None:
        self.full = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
        self.window = BatchPrefillWithRaggedKVCacheWrapper(window_workspace, "NHD")
        self.num_heads, self.head_dim = vision_config.num_heads, vision_config.head_dim
        self.merge, self.window_patches = vision_config.spatial_merge_size, vision_config.window_size // vision_config.patch_size
        self.device = device
        self._plan_info: Optional[tuple] = None  # grids the wrappers are planned for

    def plan(self, grid_thw_np: np.ndarray) -> None:
        key = tuple(map(tuple, grid_thw_np.tolist()))  # ok: FC101
        if key == self._plan_info:  # ok: FC103
            if self.full._cached_module is not None:  # expect: FC103
                return
        seqlens = np.repeat(grid_thw_np[:, 1] * grid_thw_np[:, 2], grid_thw_np[:, 0])
        cu = torch.from_numpy(np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int32))
        self.full.plan(cu, cu, self.num_heads, self.num_heads, self.head_dim, causal=False)  # ok: FC102
        self.plan_window(grid_thw_np)
        self._plan_info = key

    def plan_window(self, grid_thw_np: np.ndarray) -> None:
        cu_window_seqlens, win = [0], self.window_patches // self.merge
        for t, h, w in grid_thw_np.tolist():
            gh, gw = h // self.merge, w // self.merge
            # windows are laid over the grid padded to a multiple of the window
            for _ in range(t):
                for bh in range(0, -(-gh // win) * win, win):
                    for bw in range(0, -(-gw // win) * win, win):
                        rows, cols = max(0, min(win, gh - bh)), max(0, min(win, gw - bw))
                        cu_window_seqlens.append(cu_window_seqlens[-1] + rows * cols * self.merge**2)
        cu = torch.tensor(cu_window_seqlens, dtype=torch.int32, device=self.device)
        cu = torch.unique_consecutive(cu)  # expect: FC101
        self.window.plan(cu, cu, self.num_heads, self.num_heads, self.head_dim, causal=False)  # expect: FC102
