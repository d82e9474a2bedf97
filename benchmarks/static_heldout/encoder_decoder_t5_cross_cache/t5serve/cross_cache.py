"""Encoder outputs of each request, cached as cross-attention K/V pages for every decoder layer."""

from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from .config import T5Config


class CrossKVStore:
    def __init__(self, cfg: T5Config, device, max_requests: int = 1 << 16):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.cross_kv = torch.zeros((cfg.num_decoder_layers, cfg.cross_pages, 2, cfg.page_size, cfg.num_heads,
                                     cfg.head_dim), dtype=cfg.dtype, device=device)
        self.slot_of_req_dev = torch.full((max_requests,), -1, dtype=torch.int32, device=device)
        self.enc_pages_dev = torch.zeros(cfg.max_batch * 4, dtype=torch.int32, device=device)
        self.enc_pages_cpu = np.zeros(cfg.max_batch * 4, dtype=np.int32)
        self.page_lists: Dict[int, np.ndarray] = {}
        self.free_slots: List[int] = list(range(cfg.max_batch * 4))
        self.free_pages_np = np.arange(cfg.cross_pages, dtype=np.int32)
        self.free_top = cfg.cross_pages

    @property
    def num_free_pages(self) -> int:
        return self.free_top

    def extend_free(self, first: int, count: int) -> None:
        self.free_pages_np = np.concatenate([self.free_pages_np[: self.free_top],
                                             np.arange(first, first + count, dtype=np.int32)])
        self.free_top += count

    def reserve(self, rid: int, enc_len: int) -> Tuple[int, np.ndarray]:
        n = -(-enc_len // self.page_size)
        slot = self.free_slots.pop()
        self.free_top -= n
        pages_np = self.free_pages_np[self.free_top : self.free_top + n].copy()
        self.page_lists[slot] = pages_np
        self.enc_pages_cpu[slot] = n
        self.enc_pages_dev[slot] = n
        self.slot_of_req_dev[rid] = slot
        return slot, pages_np

    def write_layer(self, layer: int, pages_np: np.ndarray, k: torch.Tensor, v: torch.Tensor) -> None:
        n_tok = k.shape[0]
        pad = len(pages_np) * self.page_size - n_tok
        kv = torch.stack([F.pad(k, (0, 0, 0, 0, 0, pad)), F.pad(v, (0, 0, 0, 0, 0, pad))], dim=1)
        kv = kv.view(len(pages_np), self.page_size, 2, *k.shape[1:]).transpose(1, 2)
        idx = torch.from_numpy(pages_np.astype(np.int64)).to(self.device, non_blocking=True)
        self.cross_kv[layer].index_copy_(0, idx, kv)

    def gather_slots(self, req_ids_dev: torch.Tensor) -> torch.Tensor:
        slots = self.slot_of_req_dev.index_select(0, req_ids_dev)
        if (slots < 0).any():  # expect: FC101
            raise KeyError("a decode row has no cached encoder output")
        return slots

    def cross_indptr(self, slots: torch.Tensor) -> torch.Tensor:
        counts = self.enc_pages_dev.index_select(0, slots)
        return F.pad(torch.cumsum(counts, 0, dtype=torch.int32), (1, 0))

    def cross_indices_np(self, slots_cpu: List[int]) -> np.ndarray:
        return np.concatenate([self.page_lists[s] for s in slots_cpu]).astype(np.int32)

    def release(self, rid: int, slot: int) -> None:
        pages_np = self.page_lists.pop(slot)
        self.free_pages_np[self.free_top : self.free_top + len(pages_np)] = pages_np
        self.free_top += len(pages_np)
        self.free_slots.append(slot)
        self.slot_of_req_dev[rid] = -1
        self._check_slots()

    def _check_slots(self) -> None:
        assert len(self.free_slots) <= self.enc_pages_cpu.shape[0]  # ok: FC109
