from __future__ import annotations

from typing import Dict

import torch

from g3engine import GLOBAL_PAGE_SIZE, LOCAL_PAGE_SIZE, Gemma3Config, KVPool, LayerKind, PageTable, layer_kinds
from g3_attn.backend import LocalGlobalBackend
from g3_attn.metadata import StepBatch
from g3_run.graph_runner import DecodeGraphRunner
from g3_run.model import Gemma3Decoder


class Gemma3Engine:
    def __init__(self, cfg: Gemma3Config, device: str = "cuda"):
        self.cfg, self.device = cfg, torch.device(device)
        kinds = layer_kinds(cfg)
        n_local = sum(1 for k in kinds if k is LayerKind.LOCAL)
        kv = (cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, self.device)
        pools: Dict[LayerKind, KVPool] = {
            LayerKind.LOCAL: KVPool(LayerKind.LOCAL, n_local, cfg.local_pages, LOCAL_PAGE_SIZE, *kv),
            LayerKind.GLOBAL: KVPool(LayerKind.GLOBAL, len(kinds) - n_local, cfg.global_pages, GLOBAL_PAGE_SIZE, *kv),
        }
        self.pools = pools
        rows = cfg.max_batch_size
        self.local_table = PageTable(pools[LayerKind.LOCAL], rows, cfg.max_seq_len // LOCAL_PAGE_SIZE, self.device)
        self.global_table = PageTable(pools[LayerKind.GLOBAL], rows, cfg.max_seq_len // GLOBAL_PAGE_SIZE, self.device)
        self.backend = LocalGlobalBackend(cfg, pools, self.local_table, self.global_table, self.device)
        self.model = Gemma3Decoder(cfg, self.backend).to(self.device)
        self.graph_runner = DecodeGraphRunner(self.model, self.backend, cfg, self.device)
        self.graph_runner.capture_all()

    def step(self, batch: StepBatch) -> torch.Tensor:
        bs = batch.batch_size
        for table in (self.local_table, self.global_table):
            table.commit(bs)
        if batch.is_decode and self.graph_runner.can_run(bs):
            logits = self.graph_runner.replay(batch)
        elif batch.is_decode:
            self.backend.init_forward_metadata(batch)
            logits = self.model.forward_decode(batch.input_ids, batch.positions, bs)
        else:
            self.backend.init_forward_metadata(batch)
            logits = self.model.forward_extend(batch.input_ids, batch.positions)
        if batch.is_decode:
            self._advance_global_last_page(bs)
        return logits

    def _advance_global_last_page(self, bs: int) -> None:
        # advance the bound last-page lengths on the device: the next plan reads them as they are
        lp = self.backend.gbuf.last_page_len
        lp[:bs] = lp[:bs] % GLOBAL_PAGE_SIZE + 1  # expect: FC104
