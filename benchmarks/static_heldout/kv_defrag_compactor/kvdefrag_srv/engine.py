"""The decode server: compaction between steps, graph replay per bucket, an eager path past the buckets."""

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from kvdefrag.config import DefragConfig
from kvdefrag.pages import PagePool
from kvdefrag.remap import RemapTable
from kvdefrag_srv.attention import DefragAttention, PrefillBatch
from kvdefrag_srv.compactor import CompactionScheduler, Compactor
from kvdefrag_srv.graphs import DecodeGraphRunner
from kvdefrag_srv.model import DefragDecoder


@dataclass
class DecodeBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    n_pages_np: np.ndarray
    last_len_np: np.ndarray
    page_ids_np: np.ndarray
    row_owner_np: np.ndarray

    @property
    def size(self) -> int:
        return int(self.n_pages_np.shape[0])


class DefragEngine:
    def __init__(self, cfg: DefragConfig):
        self.cfg = cfg
        self.device = torch.device("cuda")
        self.pool = PagePool(cfg, self.device)
        self.remap = RemapTable(cfg.num_pages, self.device)
        self.attn = DefragAttention(cfg, self.pool, self.remap, self.device)
        self.scheduler = CompactionScheduler(cfg, self.pool, self.device)
        self.compactor = Compactor(cfg, self.pool, self.attn, self.remap, self.scheduler, cfg.frag_threshold)
        self.model = DefragDecoder(cfg, self.attn).to(self.device)
        self.runner = DecodeGraphRunner(
            cfg, self.model, self.attn, self.remap, self.compactor.copy_stream, self.device
        )
        self.steps = 0

    def start(self) -> None:
        self.runner.graph_all()

    def pick_bucket(self, n: int) -> int:
        for bs in self.cfg.buckets:
            if bs >= n:
                return bs
        return 0

    def prefill(self, prompts: List[List[int]]) -> torch.Tensor:
        lens = np.array([len(p) for p in prompts], dtype=np.int32)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        batch = PrefillBatch(
            qo_indptr=torch.tensor(cu, dtype=torch.int32, device=self.device),
            kv_indptr_host=torch.from_numpy(cu),
            num_tokens=int(cu[-1]),
        )
        self.attn.plan_prefill(batch)
        tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=self.device)
        return self.model.embed(tokens)

    def step(self, batch: DecodeBatch) -> torch.Tensor:
        self.steps += 1
        if self.scheduler.should_compact():
            self.compactor.run_pass()
        bs = self.pick_bucket(batch.size)
        if bs == 0:
            total = int(batch.n_pages_np.sum())
            self.attn.eager_kv_indices[:total].copy_(torch.from_numpy(batch.page_ids_np), non_blocking=True)
            self.attn.eager_total = total
            n_pages = torch.from_numpy(batch.n_pages_np).to(self.device, non_blocking=True)
            self.attn.plan_eager(batch.size, n_pages, total, torch.from_numpy(batch.last_len_np))
            self.attn.plan_shadow(batch.size, self.compactor.inflight_by_row(batch.row_owner_np))
            logits = self.model.forward_decode(batch.input_ids, batch.positions, batch.size)
        else:
            self.attn.prepare_decode(bs, batch.n_pages_np, batch.last_len_np, batch.page_ids_np)
            self.attn.plan_shadow(bs, self.compactor.inflight_by_row(batch.row_owner_np))
            logits = self.runner.replay(bs, batch.input_ids, batch.positions)
        self.compactor.finish()
        return logits
