"""Server loop: requests decode in the NHD pool and move to the HND pool once they grow long."""

import bisect
from dataclasses import dataclass, field

import numpy as np
import torch

from kvlayout.config import ServerConfig
from kvlayout.layouts import KVLayout, layout_code
from kvlayout.migration import Migrator
from kvlayout.pool import LayoutKVPool
from layout_attn.backend import LayoutAttnBackend
from layout_attn.batch import LayoutBatch
from layout_attn.graph_runner import LayoutGraphRunner
from layout_attn.model import LayoutLM


@dataclass
class LayoutRequest:
    rid: int
    tokens: list
    pages: list
    layout: KVLayout = KVLayout.NHD
    tail_pages: list = field(default_factory=list)
    migrating: bool = False
    index_span: tuple = (0, 0)

    @property
    def seq_len(self) -> int:
        return len(self.tokens)


class LayoutServer:
    def __init__(self, cfg: ServerConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        c = cfg
        self.pools = {
            KVLayout.NHD: LayoutKVPool(c.num_layers, c.nhd_pages, c.page_size, c.num_kv_heads, c.head_dim, KVLayout.NHD, self.device),
            KVLayout.HND: LayoutKVPool(c.num_layers, c.hnd_pages, c.page_size, c.num_kv_heads, c.head_dim, KVLayout.HND, self.device),
        }
        self.migrator = Migrator(cfg, self.pools, self.device)
        self.backend = LayoutAttnBackend(cfg, self.pools, self.migrator, self.device)
        self.model = LayoutLM(cfg, self.backend, self.pools)
        self.graphs = LayoutGraphRunner(self.model, self.backend, cfg, self.device)
        self.reqs = {}
        self._sizes = sorted(cfg.graph_batch_sizes)

    def _graph_bs(self, bs: int):
        i = bisect.bisect_left(self._sizes, bs)
        return self._sizes[i] if i < len(self._sizes) else None

    def _ensure_page(self, req: LayoutRequest):
        ps = self.cfg.page_size
        if req.seq_len % ps == 0:
            # the new token opens a page; while migrating, new pages stay in NHD as the tail
            pool = self.pools[KVLayout.NHD] if req.migrating or req.layout is KVLayout.NHD else self.pools[req.layout]
            page = pool.alloc(1)[0]
            if req.migrating:
                req.tail_pages.append(page)
            else:
                req.pages.append(page)

    def _build_batch(self, reqs: list) -> LayoutBatch:
        ps = self.cfg.page_size
        d = self.device
        for r in reqs:
            self._ensure_page(r)
        lens = np.array([r.seq_len + 1 for r in reqs], dtype=np.int32)
        codes = np.array([layout_code(r.layout) for r in reqs], dtype=np.int8)
        pos = lens - 1
        own_page = np.array([(r.tail_pages or r.pages)[-1] for r in reqs], dtype=np.int64)
        nhd_pages = np.where(codes == 0, own_page, 0)
        hnd_pages = np.where(codes == 1, own_page, 0)
        return LayoutBatch(
            rids=[r.rid for r in reqs],
            input_ids=torch.tensor([r.tokens[-1] for r in reqs], dtype=torch.long).to(d, non_blocking=True),
            seq_lens=torch.from_numpy(lens).to(d, non_blocking=True),
            seq_lens_np=lens,
            row_layout=torch.from_numpy(codes).to(d, non_blocking=True),
            row_layout_np=codes,
            pages=[r.pages for r in reqs],
            tail_pages=[r.tail_pages for r in reqs],
            nhd_write_pages=torch.from_numpy(nhd_pages).to(d, non_blocking=True),
            hnd_write_pages=torch.from_numpy(hnd_pages).to(d, non_blocking=True),
            write_offsets=torch.from_numpy((pos % ps).astype(np.int64)).to(d, non_blocking=True),
        )

    def _apply_landed(self):
        for landed in self.migrator.drain_landed():
            req = self.reqs.get(landed.rid)
            if req is None:
                continue
            old = req.pages
            req.pages, req.layout, req.migrating = landed.pages, KVLayout.HND, False
            self.pools[KVLayout.NHD].free(old)

    def _maybe_promote(self, batch: LayoutBatch):
        for i, rid in enumerate(batch.rids):
            req = self.reqs[rid]
            if req.layout is KVLayout.NHD and not req.migrating and req.seq_len >= self.cfg.promote_len:
                req.migrating = True
                self.migrator.promote(rid, list(req.pages), batch.seq_lens[i : i + 1])

    def step(self, reqs: list):
        batch = self._build_batch(reqs)
        gbs = self._graph_bs(batch.size)
        if gbs is not None:
            logits = self.graphs.replay(batch, gbs)
        else:
            self.backend.init_forward_metadata(batch)
            logits = self.model.decode(batch)
        self._apply_landed()
        self._maybe_promote(batch)
        return torch.argmax(logits, dim=-1)

    def release(self, rid: int):
        req = self.reqs.pop(rid)
        start, end = req.index_span
        # scrub the finished request's page ids so a stale row can never point at reused pages
        self.backend.graph_indices["HND"][start:end].zero_()  # expect: FC104
        self.backend.host_indices["HND"][start:end] = 0  # ok: FC104
        self.pools[req.layout].free(req.pages)
        if req.tail_pages:
            self.pools[KVLayout.NHD].free(req.tail_pages)

    def convert_pool_offline(self, key: str, layout: KVLayout):
        self.backend.retarget(key, layout)
