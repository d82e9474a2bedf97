"""The decode loop: stage through the ring, replay a bucket (or spill eagerly), read tokens back."""

from __future__ import annotations

from typing import Dict, List

import torch

from ringstage import RingConfig, SeqState, StagingRing, upload_inputs
from rs_attn.backend import DecodeBatch, StagedDecodeBackend
from rs_runtime.graphs import StagedGraphs
from rs_runtime.model import StagedModel
from rs_runtime.readback import TokenReadback


class StagedEngine:
    def __init__(self, cfg: RingConfig, device: str = "cuda"):
        self.cfg, self.device = cfg, torch.device(device)
        self.ring = StagingRing(cfg.ring_depth, cfg.max_batch, cfg.max_batch * cfg.max_pages_per_seq)
        self.backend = StagedDecodeBackend(cfg, self.device)
        self.model = StagedModel(cfg, self.backend, self.device).to(self.device)
        self.graphs = StagedGraphs(self.model, self.backend, cfg, self.device)
        self.readback = TokenReadback(cfg.ring_depth, cfg.max_batch)
        self.seqs: List[SeqState] = []
        self.lengths_dev = torch.zeros(cfg.max_batch, dtype=torch.int32, device=self.device)
        self.lens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.stop_pinned = torch.zeros(cfg.max_batch, dtype=torch.bool, pin_memory=True)
        self.graphs.record_all()

    def admit(self, seqs: List[SeqState], prompt_lens: List[int]) -> None:
        slot = self.ring.acquire()
        self.backend.stage_prefill(seqs, prompt_lens, slot)
        self.ring.publish(slot)
        for s in seqs:
            self.lengths_dev[len(self.seqs)] = s.length
            self.seqs.append(s)

    def step(self) -> List[List[int]]:
        n = len(self.seqs)
        batch = DecodeBatch(self.seqs, self.lengths_dev[:n])
        slot = self.ring.acquire()
        bs = self.graphs.bucket_for(n)
        if bs is not None:
            self.backend.stage_and_plan(bs, batch, slot)
            inputs = upload_inputs(slot, bs, self.device)
            self.ring.publish(slot)
            next_ids, _ = self.graphs.replay(bs, inputs)
            # the next step's lengths are one longer: advance the bound last-page lengths in place
            self.backend.last_page_len_dev[:n].add_(1)  # expect: FC104
        else:
            slot_mapping = self.backend.stage_spill(batch, slot)
            inputs = upload_inputs(slot, n, self.device)
            self.ring.publish(slot)
            next_ids, _ = self.model.forward_spill(inputs.input_ids, inputs.positions, slot_mapping)
        self.lengths_dev[:n] += 1
        self.lens_pinned[:n].copy_(self.lengths_dev[:n], non_blocking=True)
        longest = int(self.lens_pinned[:n].max())  # expect: FC101
        stop_dev = next_ids[:n] == self.cfg.eos_id
        self.stop_pinned[:n].copy_(stop_dev)  # expect: FC101
        self.readback.launch(next_ids[:n])
        self._retire(self.stop_pinned[:n].numpy(), longest)
        return self.readback.collect()

    def _retire(self, stop_np, longest: int) -> None:
        keep = [i for i, s in enumerate(self.seqs) if not stop_np[i] and s.length + 1 < self.cfg.max_model_len]
        for s in self.seqs:
            s.length += 1
        if longest >= self.cfg.max_model_len or len(keep) < len(self.seqs):
            self.seqs = [self.seqs[i] for i in keep]
            self.lengths_dev[: len(keep)] = self.lengths_dev[torch.tensor(keep, dtype=torch.long, device=self.device)]

    def stats(self) -> Dict[str, int]:
        out = self.backend.ring_stats()
        out["ring_waits"] = self.ring.waits
        return out
