"""Compressed KV pages: a latent (ckv) cache and a rope (kpe) cache per layer."""

from typing import Dict, List

import torch

from mlaserve.config import MLAConfig


class CompressedKVPool:
    def __init__(self, cfg: MLAConfig, device: torch.device, dtype: torch.dtype = torch.bfloat16):
        self.cfg = cfg
        self.ckv = [torch.zeros(cfg.num_pages, cfg.page_size, cfg.kv_lora_rank, dtype=dtype, device=device)
                    for _ in range(cfg.num_layers)]
        self.kpe = [torch.zeros(cfg.num_pages, cfg.page_size, cfg.qk_rope_head_dim, dtype=dtype, device=device)
                    for _ in range(cfg.num_layers)]
        self.free: List[int] = list(range(cfg.num_pages - 1, 0, -1))
        self.pages: Dict[str, List[int]] = {}

    def _check_pool(self) -> None:
        assert len(self.free) + sum(map(len, self.pages.values())) == self.cfg.num_pages - 1  # ok: FC109

    def reserve(self, rid: str, seq_len: int) -> List[int]:
        have = self.pages.setdefault(rid, [])
        need = -(-seq_len // self.cfg.page_size) - len(have)
        if need > len(self.free):
            raise MemoryError(f"need {need} pages, {len(self.free)} free")
        for _ in range(max(0, need)):
            have.append(self.free.pop())
        self._check_pool()
        return have

    def release(self, rid: str) -> None:
        self.free.extend(self.pages.pop(rid, []))
