"""Batched sampling over the logits a bucket graph (or the eager path) produced."""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
import torch
from flashinfer.sampling import top_k_top_p_sampling_from_logits

from protoserve.config import EngineConfig
from protoserve.metadata import StepMetadata


class SamplingState:
    """Per-request sampling parameters for up to ``max_bs`` rows.

    The runner keeps one prototype and takes ``copy.copy`` of it each step: the tensors are
    shared, and ``__copy__`` recomputes the batch-level shortcuts for the live rows.
    """

    def __init__(self, max_bs: int, device: torch.device | str):
        self.device = device
        self.temperatures = torch.ones(max_bs, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.top_p = torch.ones(max_bs, dtype=torch.float32, device=device)
        self.temperatures_cpu = torch.ones(max_bs, dtype=torch.float32, pin_memory=True)
        self.top_k_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.num_reqs = 0
        self.all_greedy = True
        self.top_k_max = 0

    def set_rows(self, temperatures: Sequence[float], top_k: Sequence[int], top_p: Sequence[float]):
        n = len(temperatures)
        self.temperatures_cpu[:n] = torch.as_tensor(temperatures, dtype=torch.float32)
        self.top_k_cpu[:n] = torch.as_tensor(top_k, dtype=torch.int32)
        self.temperatures[:n].copy_(self.temperatures_cpu[:n], non_blocking=True)
        self.top_k[:n].copy_(self.top_k_cpu[:n], non_blocking=True)
        self.top_p[:n].copy_(torch.as_tensor(top_p, dtype=torch.float32), non_blocking=True)
        self.num_reqs = n

    def __copy__(self) -> "SamplingState":
        new = SamplingState.__new__(SamplingState)
        new.device = self.device
        new.temperatures = self.temperatures
        new.top_k = self.top_k
        new.top_p = self.top_p
        new.temperatures_cpu = self.temperatures_cpu
        new.top_k_cpu = self.top_k_cpu
        n = new.num_reqs = self.num_reqs
        new.all_greedy = bool((self.temperatures[:n] == 0).all())  # expect: FC101
        new.top_k_max = int(self.top_k_cpu[:n].max()) if n else 0  # ok: FC101
        return new


class Sampler:
    def __init__(self, cfg: EngineConfig, device: torch.device | str):
        self.cfg = cfg
        self.device = device
        self.pad_token_id = cfg.pad_token_id
        self.uniform_logits = torch.zeros(cfg.max_batch_size, cfg.vocab_size, device=device)

    def sample(self, logits: torch.Tensor, proto: SamplingState, meta: StepMetadata) -> torch.Tensor:
        bs = meta.batch_size
        state = copy.copy(proto)
        logits = logits[:bs]
        # rows the scheduler aborted while the step was in flight (length zeroed): emit pad
        aborted = meta.seq_lens[:bs] == 0
        logits[aborted, self.pad_token_id] = float("inf")  # ok: FC101
        # a NaN row (overflow in a fp16 head) is resampled from the uniform row
        nan_rows = logits.isnan().any(dim=-1)
        logits[nan_rows] = self.uniform_logits[:bs][nan_rows]  # expect: FC101
        if state.all_greedy:
            return torch.argmax(logits, dim=-1)
        logits = logits / state.temperatures[:bs].clamp_min(1e-5).unsqueeze(1)
        return top_k_top_p_sampling_from_logits(
            logits, state.top_k[:bs], state.top_p[:bs], deterministic=True
        )


def stop_mask(next_tokens_np: np.ndarray, eos_token_id: int) -> np.ndarray:
    return next_tokens_np == eos_token_id
