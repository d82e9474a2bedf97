"""Polls completion flags, maps landed pages into the decode node's cache and page table."""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np
import torch

from kvx import CompletionFlags, PageMapper, RegisteredRegion, TransferConfig, TransferManifest
from kx_decode.backend import DecodeAttnBackend


class ReadyBatch:
    def __init__(self, manifests: List[TransferManifest], device: torch.device):
        self.manifests = manifests
        self.first_tokens = torch.empty(len(manifests), dtype=torch.int64, device=device)  # ok: FC107
        self.first_tokens.copy_(torch.tensor([m.first_token for m in manifests]), non_blocking=True)


class DecodeReceiver:
    def __init__(self, cfg: TransferConfig, flags: CompletionFlags, region: RegisteredRegion, mapper: PageMapper,
                 backend: DecodeAttnBackend, kv_cache_pages: torch.Tensor, device: torch.device):
        self.cfg = cfg
        self.flags = flags
        self.region = region
        self.mapper = mapper
        self.backend = backend
        self.kv_cache_pages = kv_cache_pages
        self.device = device
        self.bytes_received = torch.zeros(1, dtype=torch.int64, device=device)
        self.bytes_announced_host = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self.manifests: Dict[int, TransferManifest] = {}
        self.inflight_since: Dict[int, float] = {}
        self.append_cursor = 0

    def expect(self, manifest: TransferManifest) -> None:
        self.manifests[manifest.slot] = manifest
        self.flags.arm(manifest.slot, manifest.seq)
        self.inflight_since[manifest.slot] = time.monotonic()
        self.bytes_announced_host.add_(manifest.num_pages * self.cfg.page_bytes)

    def _done_slots(self) -> np.ndarray:
        f = self.flags
        if self.cfg.flags_in_device_memory:
            landed = (f.device_seq >= f.expected) & (f.expected > 0)
            return torch.nonzero(landed).flatten().cpu().numpy()  # expect: FC101
        return np.flatnonzero((f.expected_np > 0) & (f.host_seq_np >= f.expected_np))  # ok: FC101

    def poll(self) -> Optional[ReadyBatch]:
        done = self._done_slots()
        if done.size == 0:
            return None
        ready: List[TransferManifest] = []
        for slot in done.tolist():
            m = self.manifests.pop(slot)
            self.flags.arm(slot, 0)
            self.inflight_since.pop(slot, None)
            src = np.arange(m.num_pages) + m.region_offset // self.cfg.page_bytes
            local = self.mapper.map_pages(m, src)
            n = local.shape[0]
            if n > self.mapper.page_ids.numel():
                self.mapper.page_ids = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
            ids = self.mapper.page_ids[:n]
            ids.copy_(torch.from_numpy(local), non_blocking=True)
            staged = self.region.pages(m.region_offset, n, self.cfg.page_numel)
            self.kv_cache_pages.index_copy_(0, ids.long(), staged.to(self.device, non_blocking=True))
            # publish the pages where rebuild() will put them, so the next replay finds them in place
            dst = self.backend.kv_indices[self.append_cursor : self.append_cursor + n]
            dst.copy_(ids)  # expect: FC104
            self.append_cursor += n
            self.bytes_received.add_(n * self.cfg.page_bytes)
            ready.append(m)
        return ReadyBatch(ready, self.device)
