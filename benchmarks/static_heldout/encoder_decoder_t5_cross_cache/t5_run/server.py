"""Serving loop: new requests are encoded and their cross K/V cached; decode rows replay bucket graphs."""

import bisect
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from t5_attn.backend import EncDecBackend
from t5serve import CrossKVStore, DecoderBatch, T5Config

from .graphs import DecoderGraphs
from .model import T5Model


@dataclass
class EncDecRequest:
    rid: int
    prompt: List[int]
    out_tokens: List[int] = field(default_factory=lambda: [0])
    self_pages: List[int] = field(default_factory=list)
    slot: int = -1
    cross_offset: int = 0


class EncDecServer:
    def __init__(self, cfg: T5Config, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.store = CrossKVStore(cfg, self.device)
        self.backend = EncDecBackend(cfg, self.store, self.device)
        self.model = T5Model(cfg, self.backend).to(self.device)
        self.graphs = DecoderGraphs(self.model, self.backend, cfg, self.device)
        self.buckets = sorted(cfg.buckets)
        self.pending: List[EncDecRequest] = []
        self.cross_cursor = 0
        self.logits_out: Optional[torch.Tensor] = None

    def start(self) -> None:
        self.backend.init_graph_buffers()
        self.graphs.capture_all()

    def admit(self, new: List[EncDecRequest]) -> None:
        cfg = self.cfg
        lens_cpu = torch.tensor([len(r.prompt) for r in new], dtype=torch.int64)
        ids_cpu = torch.zeros(len(new), int(lens_cpu.max()), dtype=torch.int64)
        for i, r in enumerate(new):
            ids_cpu[i, : len(r.prompt)] = torch.tensor(r.prompt)
        lengths = lens_cpu.to(self.device, non_blocking=True)
        enc_out = self.model.encode(ids_cpu.to(self.device, non_blocking=True), lengths)
        need = int(((lens_cpu + cfg.page_size - 1) // cfg.page_size).sum())
        if need > self.store.num_free_pages:
            grow = max(need, cfg.cross_pages // 4)
            first = self.store.cross_kv.shape[1]
            extra = self.store.cross_kv.new_zeros((self.store.cross_kv.shape[0], grow) + self.store.cross_kv.shape[2:])
            self.store.cross_kv = torch.cat([self.store.cross_kv, extra], dim=1)  # expect: FC107
            self.store.extend_free(first, grow)
        for i, r in enumerate(new):
            n = len(r.prompt)
            r.slot, pages_np = self.store.reserve(r.rid, n)
            for layer in range(cfg.num_decoder_layers):
                k, v = self.model.cross_kv_for(layer, enc_out[i, :n])
                self.store.write_layer(layer, pages_np, k, v)
            # the joining row's encoder pages go straight into the bucket graphs' cross indices
            r.cross_offset = self.cross_cursor
            pages_dev = torch.from_numpy(pages_np).to(self.device, non_blocking=True)
            self.backend.cross_indices_buf[r.cross_offset : r.cross_offset + len(pages_np)].copy_(pages_dev)  # expect: FC104
            self.cross_cursor += len(pages_np)

    def make_batch(self, reqs: List[EncDecRequest]) -> DecoderBatch:
        cfg, dev = self.cfg, self.device
        pos_np = np.array([len(r.out_tokens) - 1 for r in reqs], dtype=np.int64)
        pages_np = np.array([r.self_pages[p // cfg.page_size] for r, p in zip(reqs, pos_np)], dtype=np.int64)
        rel_np = np.arange(-(cfg.max_distance - 1), 1)
        recent_np = np.zeros((len(reqs), cfg.max_distance), dtype=np.int64)
        for i, r in enumerate(reqs):
            tok = np.clip(pos_np[i] + rel_np, 0, None)
            recent_np[i] = np.array(r.self_pages)[tok // cfg.page_size] * cfg.page_size + tok % cfg.page_size
        counts = [len(r.self_pages) for r in reqs]
        enc_lens_cpu = torch.tensor([len(r.prompt) for r in reqs], dtype=torch.int32)
        enc_pages_cpu = (enc_lens_cpu + cfg.page_size - 1) // cfg.page_size
        cross_indptr_cpu = torch.zeros(len(reqs) + 1, dtype=torch.int32)
        cross_indptr_cpu[1:] = torch.cumsum(enc_pages_cpu, 0)
        self_indptr_cpu = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)
        last_cpu = torch.from_numpy(pos_np % cfg.page_size + 1).to(torch.int32)
        return DecoderBatch(
            req_ids=[r.rid for r in reqs],
            req_ids_dev=torch.tensor([r.rid for r in reqs]).to(dev, non_blocking=True),
            slots_cpu=[r.slot for r in reqs],
            input_ids=torch.tensor([r.out_tokens[-1] for r in reqs]).to(dev, non_blocking=True),
            positions=torch.from_numpy(pos_np).to(dev, non_blocking=True),
            out_loc=torch.from_numpy(pages_np * cfg.page_size + pos_np % cfg.page_size).to(dev, non_blocking=True),
            recent_slots=torch.from_numpy(recent_np).to(dev, non_blocking=True),
            self_indptr_cpu=self_indptr_cpu,
            self_indices=torch.tensor([p for r in reqs for p in r.self_pages], dtype=torch.int32).to(dev),
            self_last_page_len=last_cpu.to(dev, non_blocking=True),
            enc_lens_cpu=enc_lens_cpu,
            cross_indptr_cpu=cross_indptr_cpu,
        )

    def step(self, batch: DecoderBatch) -> torch.Tensor:
        if self.pending:
            self.admit(self.pending)
            self.pending = []
        bs_real = batch.batch_size
        bs = self.buckets[bisect.bisect_left(self.buckets, bs_real)]
        slots = self.store.gather_slots(batch.req_ids_dev)
        st = self.graphs.st
        st.input_ids[:bs_real].copy_(batch.input_ids, non_blocking=True)
        st.out_loc[:bs_real].copy_(batch.out_loc, non_blocking=True)
        st.recent_slots[:bs_real].copy_(batch.recent_slots, non_blocking=True)
        st.bias_rows[:bs_real].copy_(self.model.dec_bias.decode_rows(batch.positions))
        self.backend.plan_decode_step(bs, batch, slots)
        if self.logits_out is None:
            self.logits_out = torch.empty(self.cfg.max_batch, self.cfg.vocab, device=self.device)  # ok: FC107
        logits = self.graphs.replay(bs, bs_real)
        self.logits_out[:bs_real].copy_(logits)
        return self.logits_out[:bs_real]
