import bisect
import logging
from typing import List

import numpy as np
import torch

from lckv import DeviceWindow, HostPagePool, LongRequest, OffloadConfig, PrefetchScheduler, SlotRemapper
from lc_attn.backend import WindowAttnBackend
from lc_run.graphs import WindowGraphs
from lc_run.model import WindowDecoder

logger = logging.getLogger(__name__)


class OffloadEngine:
    def __init__(self, cfg: OffloadConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.pool = HostPagePool(cfg.host_pages, cfg)
        self.window = DeviceWindow(cfg)
        self.backend = WindowAttnBackend(cfg, self.window)
        self.remapper = SlotRemapper(self.window, self.pool, self.backend.kv_indices_buf, cfg)
        self.prefetch = PrefetchScheduler(self.pool, self.window, cfg)
        self.model = WindowDecoder(cfg, self.backend).to(self.device, cfg.dtype)
        self.graphs = WindowGraphs(self.model, self.backend, cfg)
        self.buckets = sorted(cfg.decode_buckets)
        self.step_no = 0

    def start(self) -> None:
        self.backend.init_window_buffers()
        self.graphs.record_all()

    def prefill_chunk(self, req: LongRequest, tokens: List[int]) -> None:
        """Chunked prefill of a long prompt straight into window slots; the
        offload of finished chunks to the host pool runs elsewhere."""
        page = self.cfg.page_size
        start = req.seq_len
        req.seq_len += len(tokens)
        need = (req.seq_len + page - 1) // page - len(req.host_pages)
        req.host_pages.extend(self.pool.alloc(need))
        pages = req.window_pages(self.cfg.sink_pages, self.cfg.window_pages_per_req)
        view = self.remapper.remap([pages], np.array([req.seq_len]), [req.summary_slots or [0]])
        self.prefetch.begin_step(view)
        for g in range(self.cfg.num_groups):
            self.prefetch.issue(g)
        kv_indptr_cpu = torch.tensor([0, pages.size], dtype=torch.int32)
        qo_indptr_cpu = torch.tensor([0, len(tokens)], dtype=torch.int32)
        self.backend.plan_chunk(qo_indptr_cpu, kv_indptr_cpu, view.slot_ids, view.last_page_host)
        ids = torch.tensor(tokens, dtype=torch.long).to(self.device, non_blocking=True)
        pos = torch.arange(start, req.seq_len, device=self.device)
        self.model.forward_chunk(ids, pos)

    def decode_step(self, reqs: List[LongRequest]) -> torch.Tensor:
        n = len(reqs)
        bs = self.buckets[bisect.bisect_left(self.buckets, n)]
        page_lists = [r.window_pages(self.cfg.sink_pages, self.cfg.window_pages_per_req) for r in reqs]
        seq_lens_np = np.array([r.window_len(self.cfg.sink_pages, self.cfg.window_pages_per_req, self.cfg.page_size)
                                for r in reqs], dtype=np.int32)
        view = self.remapper.remap(page_lists, seq_lens_np, [r.summary_slots for r in reqs])
        self.prefetch.begin_step(view)
        self.backend.prepare_window(bs, view)
        ids = torch.tensor([r.last_token for r in reqs], dtype=torch.long).to(self.device, non_blocking=True)
        pos = torch.tensor([r.seq_len - 1 for r in reqs], dtype=torch.long).to(self.device, non_blocking=True)
        self.graphs.load_inputs(bs, ids, pos)
        for g in range(min(self.prefetch.ahead, self.cfg.num_groups)):
            self.prefetch.issue(g)
        for g in range(self.cfg.num_groups):
            self.prefetch.issue(g + self.prefetch.ahead)
            self.prefetch.wait(g)
            self.graphs.replay(bs, g)
        logits = self.model.head(self.graphs.output(bs)[:n])
        self.step_no += 1
        if self.step_no % self.cfg.log_every == 0:
            logger.info(f"step {self.step_no}: bucket {bs}, resident pages {self.window.occupancy}")  # expect: FC101
        return logits

    def replay_summary(self) -> dict:
        return {"steps": self.step_no, "window_hits": self.window.hit_count.tolist()}  # ok: FC101
