"""The decode cluster's latent KV pool and the remote -> local page map filled as transfers land."""
from typing import Dict, List

import torch

from xdc.config import DecodeClusterConfig
from xdc.manifest import PageManifest


class DecodePagePool:
    def __init__(self, cfg: DecodeClusterConfig, device: torch.device):
        width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
        self.kv_cache = [torch.zeros(cfg.max_pages, cfg.page_size, width, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.ckv_cache = [c[..., : cfg.kv_lora_rank] for c in self.kv_cache]
        self.kpe_cache = [c[..., cfg.kv_lora_rank :] for c in self.kv_cache]
        self.num_pages = cfg.max_pages
        self.free: List[int] = list(range(cfg.max_pages - 1, 0, -1))

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free):
            raise RuntimeError(f"decode pool exhausted: {n} pages wanted, {len(self.free)} free")
        return [self.free.pop() for _ in range(n)]

    def release(self, pages: List[int]) -> None:
        self.free.extend(pages)
        self._check_free_list()

    def _check_free_list(self) -> None:
        assert len(self.free) < self.num_pages and len(set(self.free)) == len(self.free), "page freed twice"  # ok: FC109


class PageRemapper:
    """Remote page ids are global per prefill node; the device table feeds the landing scatter."""

    def __init__(self, cfg: DecodeClusterConfig, device: torch.device):
        self.device = device
        self.table_host: Dict[int, int] = {}
        self.table_gpu = torch.full((cfg.remap_initial,), -1, dtype=torch.int32, device=device)

    def install(self, manifest: PageManifest, remote_ids: List[int], local_pages: List[int]) -> None:
        assert len(local_pages) == manifest.num_pages == len(remote_ids), "manifest and page lists disagree"  # expect: FC109
        max_remote = max(remote_ids)
        if max_remote >= self.table_gpu.numel():
            grow = max_remote + 1 - self.table_gpu.numel()
            self.table_gpu = torch.cat([self.table_gpu, self.table_gpu.new_full((grow,), -1)])  # expect: FC107
        idx = torch.tensor(remote_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        vals = torch.tensor(local_pages, dtype=torch.int32).to(self.device, non_blocking=True)
        self.table_gpu.index_copy_(0, idx, vals)
        for remote, local in zip(remote_ids, local_pages):
            self.table_host[remote] = local

    def forget(self, remote_ids: List[int]) -> None:
        for remote in remote_ids:
            self.table_host.pop(remote, None)
        idx = torch.tensor(remote_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        self.table_gpu.index_fill_(0, idx, -1)
