from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List

import flashcheck
import numpy as np
import torch

from longrope.attn_backend import DecodeInputs, DualRegimeBackend
from longrope.config import EngineConfig
from longrope.graph_runner import RegimeGraphRunner
from longrope.kernels.advance import advance_decode_state
from longrope.model import LongRopeModel
from longrope.recompute import RegimeSwitchRecompute
from longrope.rope import LongRopeCache

logger = logging.getLogger(__name__)


@dataclass
class Seq:
    rid: int
    pages: List[int]
    seq_len: int
    last_token: int
    output: List[int] = field(default_factory=list)


class StepInputs:
    """Built fresh every step."""

    def __init__(self, seqs: List[Seq], page_size: int, device: torch.device):
        n = len(seqs)
        self.seq_lens_cpu = torch.tensor([s.seq_len for s in seqs], dtype=torch.int32)
        self.input_ids = torch.tensor([s.last_token for s in seqs], dtype=torch.int64).to(device, non_blocking=True)
        self.positions = (self.seq_lens_cpu - 1).long().to(device, non_blocking=True)
        self.seq_lens_gpu = self.seq_lens_cpu.to(device, non_blocking=True)
        self.regime_mask = torch.zeros(n, dtype=torch.bool, device=device)  # ok: FC107
        pages_np = np.asarray([len(s.pages) for s in seqs], dtype=np.int32)
        indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr[1:])
        self.pages_np = pages_np
        self.pages_gpu = torch.from_numpy(pages_np).to(device, non_blocking=True)
        # request row of every KV page, read by the KV-append kernel
        self.page_row = torch.repeat_interleave(torch.arange(n, device=device), self.pages_gpu,  # ok: FC101
                                                output_size=int(pages_np.sum()))
        self.kv_indptr_cpu = torch.from_numpy(indptr).pin_memory()
        flat = np.concatenate([np.asarray(s.pages, dtype=np.int32) for s in seqs])
        self.kv_indices = torch.from_numpy(flat).to(device, non_blocking=True)
        last = (self.seq_lens_cpu - 1) % page_size + 1
        self.last_page_len_cpu = last.int().pin_memory()

    def decode_inputs(self) -> DecodeInputs:
        return DecodeInputs(len(self.seq_lens_cpu), self.kv_indptr_cpu, self.kv_indices,
                            self.last_page_len_cpu, self.seq_lens_gpu)


class LongRopeScheduler:
    def __init__(self, cfg: EngineConfig, short_factor: List[float], long_factor: List[float],
                 device: torch.device):
        self.cfg = cfg
        self.device = device
        self.rope = LongRopeCache(cfg.head_dim, short_factor, long_factor, cfg.original_max, cfg.max_position,
                                  cfg.rope_base, device)
        self.backend = DualRegimeBackend(cfg, device)
        self.recompute = RegimeSwitchRecompute(cfg, device)
        self.model = LongRopeModel(cfg, self.rope, self.backend).to(device, dtype=torch.bfloat16)
        n_pages = cfg.max_bs * cfg.max_pages_per_req
        self.kv_caches = [torch.zeros(n_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                                      dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.graphs = RegimeGraphRunner(cfg, self.model, self.backend, self.kv_caches, device)
        self.running: List[Seq] = []
        self.regime = "short"
        self.short_temp = torch.tensor(1.0, device=device)
        self.long_temp = torch.tensor(0.85, device=device)

    def warmup(self) -> None:
        self.graphs.capture_all()

    @flashcheck.hot_path
    def step(self) -> torch.Tensor:
        seqs = self.running
        step = StepInputs(seqs, self.cfg.page_size, self.device)
        if (step.positions >= self.cfg.original_max).any():  # expect: FC101
            self.regime = "long"
        crossing = self.rope.rows_crossing(step.seq_lens_gpu)
        if crossing.numel() > 0:
            self._recompute_rows(step)
        n = len(seqs)
        inp = step.decode_inputs()
        bs = self.graphs.pick(n)
        if bs > 0:
            logits = self.graphs.replay(self.regime, bs, step, inp)
        else:
            self.backend.init_forward_metadata(self.regime, inp)
            logits = self.model(step.input_ids, step.positions, self.kv_caches, self.regime, n)
        # rows past original_max sample with the long-context temperature
        temps = torch.where(step.positions[:n] >= self.cfg.original_max, self.long_temp, self.short_temp)  # ok: FC101
        logits = logits[:n] / temps.unsqueeze(-1).to(logits.dtype)
        # advance on the device so the next step can skip re-planning inside a page
        advance_decode_state(self.backend.graph_last_page_len, step.seq_lens_gpu, n, self.cfg.page_size)  # expect: FC104
        return logits

    def _recompute_rows(self, step: StepInputs) -> None:
        seq_lens_np = step.seq_lens_cpu.numpy()
        self.recompute.plan_recompute(seq_lens_np, step.pages_gpu, step.kv_indices)
        regime = self.rope.select_regime(step.seq_lens_cpu)
        logger.info("recomputing KV under the %s regime for %d rows", regime, len(seq_lens_np))
