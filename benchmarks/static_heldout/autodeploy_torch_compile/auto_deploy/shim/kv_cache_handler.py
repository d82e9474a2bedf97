"""KV-cache resource handler: the caches the transform asks for, and the attention workspaces."""

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from auto_deploy.custom_ops.attention_interface import SequenceInfo
from auto_deploy.custom_ops.flashinfer_attention import get_planner


@dataclass
class CacheConfig:
    dtype: torch.dtype = torch.bfloat16
    free_mem_ratio: float = 0.8
    use_trtllm_decode: bool = False
    trtllm_workspace_bytes: int = 128 << 20


class KVCacheHandler:
    """Allocates the paged caches (one initializer per cache, registered by the transform) and workspaces."""

    def __init__(self, seq_info: SequenceInfo, cache_config: CacheConfig, *, device: torch.device):
        self.seq_info = seq_info
        self.cache_config = cache_config
        self.device = device
        # page layout of every cache this handler allocates: [pages, page_size, kv_heads, head_dim]
        self._kv_layout = "NHD"
        self.num_pages = 0
        self._initializers: Dict[str, Callable[[int], torch.Tensor]] = {}
        self.caches: Dict[str, torch.Tensor] = {}
        self.float_workspace: Optional[torch.Tensor] = None
        self.ctx_workspace: Optional[torch.Tensor] = None

    def register_cache(self, name: str, initializer: Callable[[int], torch.Tensor]) -> None:
        self._initializers[name] = initializer

    def new_cache(self, num_kv_heads: int, head_dim: int, num_pages: int) -> torch.Tensor:
        return torch.empty(
            num_pages, self.seq_info.page_size, num_kv_heads, head_dim, dtype=self.cache_config.dtype, device=self.device
        )

    def bytes_per_page(self) -> int:
        probe = {name: init(1) for name, init in self._initializers.items()}
        return sum(t.numel() * t.element_size() for t in probe.values())

    def initialize_caches(self, num_pages: int) -> Dict[str, torch.Tensor]:
        self.num_pages = num_pages
        self.caches = {name: init(num_pages) for name, init in self._initializers.items()}
        return self.caches

    def initialize_workspaces(self) -> None:
        mb = int(os.environ.get("AD_FLASHINFER_WORKSPACE_MB", "256"))
        self.float_workspace = torch.empty(mb << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        trtllm_workspace = None
        if self.cache_config.use_trtllm_decode:
            trtllm_workspace = torch.empty(self.cache_config.trtllm_workspace_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        # the trtllm-gen context kernel counts finished tiles in here
        self.ctx_workspace = torch.empty(self.seq_info.max_num_tokens * 4096, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.ctx_workspace.zero_()
        get_planner().init_workspace(
            self.float_workspace, trtllm_workspace=trtllm_workspace, ctx_workspace=self.ctx_workspace
        )

    def remap_pages(self, moved: Dict[int, int]) -> None:
        """After a compaction moved pages, point the running sequences' page lists at their new homes."""
        lut = torch.arange(self.num_pages, dtype=torch.int32, device=self.device)
        src = torch.tensor(list(moved), dtype=torch.int64, device=self.device)
        lut[src] = torch.tensor(list(moved.values()), dtype=torch.int32, device=self.device)
        n = self.seq_info.num_pages_in_use
        self.seq_info.cache_loc[:n] = lut[self.seq_info.cache_loc[:n].long()]  # expect: FC104
        for name, cache in self.caches.items():
            cache[lut[src].long()] = cache[src]

    def release(self) -> List[str]:
        names = list(self.caches)
        self.caches.clear()
        return names
