"""The decode loop: resident layers replayed from a graph, streamed layers one prefetch ahead."""

import functools
from typing import List

import numpy as np
import torch

from wstream import DeviceLayerLRU, HostWeightStore, Prefetcher, StreamConfig, split_layer
from ws_attn.backend import DecodeBatch, OffloadAttentionBackend
from ws_model.layers import StreamedLM
from ws_model.runner import OffloadGraphRunner


class OffloadEngine:
    def __init__(self, cfg: StreamConfig, host_layers: List[torch.Tensor], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.store = HostWeightStore(host_layers)
        self.lru = DeviceLayerLRU(cfg.num_slots, cfg.layer_numel, cfg.num_layers, cfg.dtype, device,
                                  functools.partial(split_layer, cfg=cfg))
        self.prefetcher = Prefetcher(self.store, self.lru, cfg.num_layers)
        self.backend = OffloadAttentionBackend(cfg, device)
        self.model = StreamedLM(cfg, self.backend).to(device)
        self.runner = OffloadGraphRunner(cfg, self.model, self.backend, self.lru, device)

    def start(self) -> None:
        for layer in range(self.cfg.resident_layers):
            self.prefetcher.issue(layer)
            self.lru.pin(layer)
        torch.cuda.synchronize()
        self.runner.bind_resident()
        self.runner.record_resident()

    def make_batch(self, ids: np.ndarray, seq_lens: np.ndarray, pages: List[List[int]]) -> DecodeBatch:
        counts = np.array([len(p) for p in pages], dtype=np.int32)
        table = np.zeros((len(pages), self.cfg.max_pages), dtype=np.int32)
        for r, p in enumerate(pages):
            table[r, : len(p)] = p
        return DecodeBatch(
            batch_size=len(pages),
            input_ids=torch.as_tensor(ids, device=self.device),
            seq_lens=torch.as_tensor(seq_lens, dtype=torch.int32, device=self.device),
            seq_lens_cpu=seq_lens,
            kv_indices=torch.as_tensor(np.concatenate([np.asarray(p, dtype=np.int32) for p in pages]),
                                       device=self.device),
            block_tables=torch.as_tensor(table, device=self.device),
            page_counts_cpu=counts,
        )

    def decode_step(self, batch: DecodeBatch) -> torch.Tensor:
        c = self.cfg
        n = batch.batch_size
        self.prefetcher.issue(c.resident_layers)  # the first streamed layer fills while the graph runs
        bs = self.runner.bucket_for(n)
        h = self.runner.replay(bs, batch) if bs is not None else None
        start = c.resident_layers
        if h is None:
            # eager fallback: a resident layer was evicted, or the batch exceeds the buckets
            h = self.model.embed(batch.input_ids)
            start = 0
        self.backend.plan_eager(batch)
        cold = np.flatnonzero(~self.lru.resident_np[start:]) + start  # ok: FC101
        for layer in range(start, c.num_layers):
            if layer + 1 < c.num_layers:
                self.prefetcher.issue(layer + 1)
            if layer in cold:
                self.prefetcher.ready[layer].synchronize()  # expect: FC101
            slot = self.lru.lookup(layer)
            torch.cuda.current_stream().wait_event(self.prefetcher.ready[layer])
            h = self.model.layers[layer](h, self.lru.view(slot), self.model.kv_caches[layer], None)
            self.prefetcher.freed[slot].record()
        # the next step's last-page lengths, advanced in place for the graph
        lp = self.backend.kv_last_page_len[:n]
        torch.where(lp == c.page_size, torch.ones_like(lp), lp + 1, out=lp)  # expect: FC104
        return self.model.logits(h)
