"""SDPA over gathered pages: the correctness reference, and the fallback where FlashInfer is unavailable."""
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ice import DecodeBatch, EngineConfig


@dataclass
class _RefStep:
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    out_loc: torch.Tensor


class ReferenceBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.graph_wrappers: Dict[int, object] = {}
        self._step: Optional[_RefStep] = None

    def bucket_for(self, bs: int) -> Optional[int]:
        return None  # the reference path never captures

    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        page = self.cfg.page_size
        last = batch.seq_lens - 1
        rows = torch.gather(batch.page_table, 1, (last // page).long()[:, None])[:, 0]
        self._step = _RefStep(batch.page_table, batch.seq_lens, rows.long() * page + last % page)

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> None:
        loc = self._step.out_loc
        page, slot = loc // self.cfg.page_size, loc % self.cfg.page_size
        kv_cache[page, 0, :, slot] = k
        kv_cache[page, 1, :, slot] = v

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, windowed: bool) -> torch.Tensor:
        cfg = self.cfg
        step = self._step
        pages = kv_cache[step.page_table.long()]  # [bs, P, 2, kv_heads, page_size, dim]
        k = pages[:, :, 0].permute(0, 2, 1, 3, 4).flatten(2, 3)  # [bs, kv_heads, P * page_size, dim]
        v = pages[:, :, 1].permute(0, 2, 1, 3, 4).flatten(2, 3)
        span = torch.arange(k.shape[2], device=q.device)[None, :]
        visible = span < step.seq_lens[:, None]
        if windowed:
            visible = visible & (span >= step.seq_lens[:, None] - cfg.sliding_window)
        rep = cfg.num_heads // cfg.num_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=visible[:, None, None, :])
        return out[:, :, 0, :]

    def note_appended(self, bs: int) -> None:
        return None
