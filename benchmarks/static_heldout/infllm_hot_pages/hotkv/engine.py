from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

from hotkv.backend import HotPageAttnBackend
from hotkv.graph_runner import HotGraphRunner
from hotkv.host_pool import HostKVPool
from hotkv.hot_cache import HotPageCache
from hotkv.model import HotDecoder
from hotkv.selector import BlockSelector

logger = logging.getLogger(__name__)


@dataclass
class LongRequest:
    rid: int
    slot: int
    pages: List[int]
    seq_len: int
    last_token: int
    output: List[int] = field(default_factory=list)


class OffloadEngine:
    def __init__(self, cfg: dict, device: torch.device):
        self.cfg = cfg
        self.device = device
        L, H, Hkv, D, ps = cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["page_size"]
        self.page_size = ps
        self.host = HostKVPool(L, cfg["host_pages"], ps, Hkv, D)
        self.backend = HotPageAttnBackend(H, Hkv, D, ps, cfg["hot_slots"], cfg["max_bs"], cfg["max_hot_pages"],
                                          cfg["ring_pages"], device, use_trtllm_long=cfg.get("trtllm", False))
        self.hot = HotPageCache(self.host, cfg["hot_slots"], L, Hkv, D, device,
                                graph_indices=self.backend.hot_indices)
        self.selector = BlockSelector(Hkv, D, cfg["pages_per_block"], cfg["topk_blocks"], cfg["sink_pages"],
                                      cfg["window_pages"], cfg["max_blocks"], device)
        self.model = HotDecoder(L, H * D, cfg["vocab"], H, D, self.backend).to(device)
        self.ring_kv = torch.zeros(L, cfg["max_bs"] * cfg["ring_pages"], 2, ps, Hkv, D,
                                   dtype=torch.bfloat16, device=device)
        self.graphs = HotGraphRunner(self.model, self.backend, self.hot.kv, self.ring_kv, cfg["graph_bs"], device)
        self.running: List[LongRequest] = []
        self.last_q = torch.zeros(cfg["max_bs"], H * D, dtype=torch.bfloat16, device=device)

    def start(self) -> None:
        self.graphs.record()

    def decode_step(self) -> torch.Tensor:
        reqs = self.running
        bs_real = len(reqs)
        sel = self.selector.select(self.last_q[:bs_real], [r.slot for r in reqs], [r.pages for r in reqs])
        slot_rows = []
        for row in sel.rows:
            ids_cpu = np.asarray(row, dtype=np.int64)
            ids_gpu = torch.from_numpy(ids_cpu).to(self.device, non_blocking=True)
            slot_rows.append(self.hot.admit(ids_cpu, ids_gpu))
        ring_last = np.asarray([(r.seq_len - 1) % self.page_size + 1 for r in reqs], dtype=np.int32)
        for r in reqs:
            if r.seq_len % (self.page_size * self.selector.pages_per_block) == 0:
                blk = len(r.pages) // self.selector.pages_per_block - 1
                self.selector.update_rep_keys(r.slot, blk, self.ring_kv[0, r.slot, 0])
        input_ids = torch.tensor([r.last_token for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True)
        bs = self.graphs.bucket(bs_real)
        if bs > 0:
            self.backend.prepare_hot_replay(bs, slot_rows, ring_last)
            return self.graphs.run(input_ids, bs)
        self.backend.plan_eager(slot_rows, ring_last)
        return self.model(input_ids, self.hot.kv, self.ring_kv, bs_real)

    def finish_step(self, logits: torch.Tensor) -> Dict[int, int]:
        """Output thread: reads tokens one step behind and offloads completed pages."""
        toks = logits.argmax(-1).cpu().numpy()  # ok: FC101
        out = {}
        for r, t in zip(self.running, toks):
            r.last_token = int(t)
            r.seq_len += 1
            out[r.rid] = int(t)
        return out
