"""FlashInfer sampling: a graph-safe path for plain batches, an eager one for seeded / min-p batches."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import flashinfer.sampling as fs
import numpy as np
import torch

from penaltyserve.config import EngineConfig, ProcessorKind, SamplingParams
from penaltyserve.sampling.penalties import PenaltyState


def _check_seed(seed: int) -> None:
    assert 0 <= seed < 2**63, "seed must fit in int64"  # expect: FC109


class GraphSampler:
    def __init__(self, cfg: EngineConfig, penalties: PenaltyState) -> None:
        dev = torch.device(cfg.device)
        self.device = dev
        self.vocab_size = cfg.vocab_size
        max_bs = cfg.max_batch_size
        self.penalties = penalties
        # per-row inputs read by the captured sampler
        self.temperature = torch.ones(max_bs, dtype=torch.float32, device=dev)
        self.top_k = torch.full((max_bs,), cfg.vocab_size, dtype=torch.int32, device=dev)
        self.top_p = torch.ones(max_bs, dtype=torch.float32, device=dev)
        self.has_seed = torch.zeros(max_bs, dtype=torch.bool, device=dev)
        # host side, one row per slot
        self.temperature_cpu = torch.ones(max_bs, dtype=torch.float32, pin_memory=True)
        self.top_k_cpu = torch.full((max_bs,), cfg.vocab_size, dtype=torch.int32, pin_memory=True)
        self.top_p_cpu = torch.ones(max_bs, dtype=torch.float32, pin_memory=True)
        self.has_seed_cpu = torch.zeros(max_bs, dtype=torch.bool, pin_memory=True)
        self.seeds_cpu = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.min_p_cpu = torch.zeros(max_bs, dtype=torch.float32, pin_memory=True)
        self.slot_params: Dict[int, SamplingParams] = {}
        self.generators: Dict[str, torch.Generator] = {}
        self.min_p_buf: Optional[torch.Tensor] = None
        self.rand_buf: Optional[torch.Tensor] = None

    # ------------------------------------------------------------- admission
    def set_seed(self, rid: str, slot: int, seed: int) -> None:
        _check_seed(seed)
        self.seeds_cpu[slot] = seed
        self.generators.pop(rid, None)

    def add_request(self, rid: str, slot: int, params: SamplingParams) -> None:
        self.slot_params[slot] = params
        if params.seed is not None:
            self.set_seed(rid, slot, params.seed)

    # --------------------------------------------------------------- per step
    def batch_kind(self, slots: Sequence[int]) -> ProcessorKind:
        kind = ProcessorKind.NONE
        for slot in slots:
            kind |= self.slot_params[slot].processors()
        return kind

    def load(self, slots_np: np.ndarray, bucket: int) -> None:
        bs = slots_np.shape[0]
        rows = [self.slot_params[int(s)] for s in slots_np]
        self.temperature_cpu[:bs] = torch.tensor([max(p.temperature, 1e-5) for p in rows])
        self.top_k_cpu[:bs] = torch.tensor([p.top_k if p.top_k > 0 else self.vocab_size for p in rows], dtype=torch.int32)
        self.top_p_cpu[:bs] = torch.tensor([p.top_p for p in rows])
        self.has_seed_cpu[:bs] = torch.tensor([p.seed is not None for p in rows])
        self.min_p_cpu[:bs] = torch.tensor([p.min_p for p in rows])
        self.temperature_cpu[bs:bucket] = 1.0
        self.top_k_cpu[bs:bucket] = self.vocab_size
        self.top_p_cpu[bs:bucket] = 1.0
        self.temperature[:bucket].copy_(self.temperature_cpu[:bucket], non_blocking=True)
        self.top_k[:bucket].copy_(self.top_k_cpu[:bucket], non_blocking=True)
        self.top_p[:bucket].copy_(self.top_p_cpu[:bucket], non_blocking=True)
        self.has_seed[:bs].copy_(self.has_seed_cpu[:bs], non_blocking=True)

    # ----------------------------------------------------------- in the graph
    def sample_in_graph(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        logits = self.penalties.apply(logits.float(), bs)
        logits = logits / self.temperature[:bs, None]
        return fs.top_k_top_p_sampling_from_logits(
            logits, self.top_k[:bs], self.top_p[:bs], filter_apply_order="joint", deterministic=True
        )

    # ------------------------------------------------------------------ eager
    def sample_eager(self, logits: torch.Tensor, rids: List[str], kind: ProcessorKind) -> torch.Tensor:
        bs = len(rids)
        logits = self.penalties.apply(logits.float(), bs)
        probs = torch.softmax(logits / self.temperature[:bs, None], dim=-1)
        probs = fs.top_k_renorm_probs(probs, self.top_k[:bs])
        probs = fs.top_p_renorm_probs(probs, self.top_p[:bs])
        if kind & ProcessorKind.MIN_P:
            if self.min_p_buf is None:
                self.min_p_buf = torch.zeros(self.top_p.shape[0], dtype=torch.float32, device=self.device)  # ok: FC107
            self.min_p_buf[:bs].copy_(self.min_p_cpu[:bs], non_blocking=True)
            if not kind & ProcessorKind.SEEDED:
                return fs.min_p_sampling_from_probs(probs, self.min_p_buf[:bs], deterministic=True)
            probs = self._min_p_filter(probs, bs)
        # seeded rows draw their exponential noise from their own generator
        if self.rand_buf is None or self.rand_buf.shape[0] < bs:
            self.rand_buf = torch.empty(bs, self.vocab_size, dtype=torch.float32, device=self.device)  # expect: FC107
        q = self.rand_buf[:bs]
        q.exponential_()
        seeded_rows = [row for row in range(bs) if self.has_seed[row]]  # expect: FC101
        seeds = self.seeds_cpu[:bs].tolist()  # ok: FC101
        for row in seeded_rows:
            rid = rids[row]
            gen = self.generators.get(rid)
            if gen is None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(seeds[row])
                self.generators[rid] = gen
            q[row].exponential_(generator=gen)
        return probs.div_(q).argmax(dim=-1)

    def _min_p_filter(self, probs: torch.Tensor, bs: int) -> torch.Tensor:
        top = probs.amax(dim=-1, keepdim=True)
        keep = probs >= self.min_p_buf[:bs, None] * top
        probs = probs * keep
        return probs / probs.sum(dim=-1, keepdim=True)
