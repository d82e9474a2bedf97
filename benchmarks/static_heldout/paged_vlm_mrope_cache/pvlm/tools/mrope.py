"""M-RoPE (t, h, w) position ids per step; a request's ``rope_delta`` makes its decode positions O(1)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from pvlm.config import VLMConfig
from pvlm.vision.encoder_cache import MMInputs


@dataclass
class Segment:
    kind: str  # "text" or "image"
    length: int
    mm: Optional[MMInputs] = None


@dataclass
class ActiveRequest:
    conv_id: int
    slot: int
    tokens: List[int]
    segments: List[Segment]
    seq_len: int = 0
    max_new_tokens: int = 512
    page_ids: List[int] = field(default_factory=list)
    image_page_ids: List[int] = field(default_factory=list)
    graph_span: Optional[tuple] = None


@dataclass
class StepBatch:
    prefills: List[ActiveRequest] = field(default_factory=list)
    decodes: List[ActiveRequest] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.prefills) + len(self.decodes)


@torch.jit.script
def text_positions(start: int, n: int) -> torch.Tensor:
    assert n >= 0  # ok: FC109
    return torch.arange(start, start + n, dtype=torch.int64).unsqueeze(0).expand(3, n)


class MRopePositionComputer:
    def __init__(self, cfg: VLMConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.rope_deltas_np = np.zeros(cfg.max_num_seqs, dtype=np.int64)
        self.pos_staging = torch.empty((3, cfg.max_prefill_tokens), dtype=torch.int64, pin_memory=True)
        self.mrope_positions = torch.zeros((3, cfg.max_prefill_tokens), dtype=torch.int64, device=device)

    def _prefill_positions(self, req: ActiveRequest, out: np.ndarray) -> int:
        m = self.cfg.spatial_merge_size
        cur = 0
        next_pos = 0
        for seg in req.segments:
            if seg.kind == "text":
                out[:, cur : cur + seg.length] = np.arange(next_pos, next_pos + seg.length)
                next_pos += seg.length
                cur += seg.length
                continue
            t, h, w = seg.mm.grid_thw.tolist()  # expect: FC101
            if t * h * w == 0:
                raise ValueError(f"empty image grid {seg.mm.grid_thw} in conversation {req.conv_id}")  # ok: FC101
            gh, gw = h // m, w // m
            n = t * gh * gw
            out[0, cur : cur + n] = np.repeat(np.arange(t), gh * gw) + next_pos
            out[1, cur : cur + n] = np.tile(np.repeat(np.arange(gh), gw), t) + next_pos
            out[2, cur : cur + n] = np.tile(np.arange(gw), t * gh) + next_pos
            next_pos += max(t, gh, gw)
            cur += n
        self.rope_deltas_np[req.slot] = next_pos - cur
        return cur

    def compute(self, batch: StepBatch) -> torch.Tensor:
        total = batch.num_tokens
        if self.pos_staging.shape[1] < total:
            self.pos_staging = torch.empty((3, 2 * total), dtype=torch.int64, pin_memory=True)  # ok: FC107
        out = self.pos_staging.numpy()
        cur = 0
        for req in batch.prefills:
            cur += self._prefill_positions(req, out[:, cur:])
        for req in batch.decodes:
            delta = int(self.rope_deltas_np[req.slot])  # ok: FC101
            out[:, cur] = req.seq_len + delta
            cur += 1
        self.mrope_positions = torch.empty((3, total), dtype=torch.int64, device=self.device)  # expect: FC107
        self.mrope_positions.copy_(self.pos_staging[:, :total], non_blocking=True)
        return self.mrope_positions
