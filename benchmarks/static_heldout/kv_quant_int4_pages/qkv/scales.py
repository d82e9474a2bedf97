"""Per-page quantization scales, kept in a buffer parallel to the page pool."""
from __future__ import annotations

import torch

from qkv.config import QuantKVConfig


class PageScaleTable:
    """``k_scale[layer, page, kv_head, group]`` and ``v_scale`` for every pool page.

    ``page_amax`` is the running absolute maximum of what was appended to a page;
    the tracker compares it against the page's scale to find pages to requantize.
    """

    def __init__(self, cfg: QuantKVConfig, device: torch.device):
        shape = (cfg.num_layers, cfg.num_pages, cfg.num_kv_heads, cfg.groups_per_head)
        self.k_scale = torch.ones(shape, dtype=torch.float16, device=device)
        self.v_scale = torch.ones(shape, dtype=torch.float16, device=device)
        self.page_amax = torch.zeros((cfg.num_layers, cfg.num_pages), dtype=torch.float32, device=device)

    def set_scales(self, layer: int, page_ids: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        assert k_scale.shape == v_scale.shape, "k and v scales must cover the same pages"  # expect: FC109
        self.k_scale[layer, page_ids] = k_scale
        self.v_scale[layer, page_ids] = v_scale

    def reset_pages(self, page_ids: torch.Tensor) -> None:
        self.k_scale[:, page_ids] = 1.0
        self.v_scale[:, page_ids] = 1.0
        self.page_amax[:, page_ids] = 0.0

    def layer_view(self, layer: int):
        return self.k_scale[layer], self.v_scale[layer]
