"""Per-slot penalty state kept on the device and read by the captured decode graph."""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from penaltyserve.config import EngineConfig, SamplingParams


class PenaltyState:
    """Output-token counts, prompt masks and per-row penalty factors.

    Rows of ``output_counts`` / ``prompt_mask`` belong to request slots; each
    step ``stage_batch`` gathers the batch's factors into the ``step_*``
    vectors that the captured ``apply`` reads.
    """

    _STEP_VECTORS = ("step_rep", "step_freq", "step_pres")

    def __init__(self, cfg: EngineConfig) -> None:
        dev = torch.device(cfg.device)
        self.device = dev
        self.max_batch_size = cfg.max_batch_size
        self.vocab_size = cfg.vocab_size
        max_bs = cfg.max_batch_size
        self.output_counts = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.int32, device=dev)
        self.prompt_mask = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.bool, device=dev)
        self.has_penalty = torch.zeros(max_bs, dtype=torch.bool, device=dev)
        self.batch_slots = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.step_rep = torch.ones(max_bs, dtype=torch.float32, device=dev)
        self.step_freq = torch.zeros(max_bs, dtype=torch.float32, device=dev)
        self.step_pres = torch.zeros(max_bs, dtype=torch.float32, device=dev)
        # host side: per-slot factors and flags, filled at admission
        self.step_rep_cpu = torch.ones(max_bs, dtype=torch.float32, pin_memory=True)
        self.step_freq_cpu = torch.zeros(max_bs, dtype=torch.float32, pin_memory=True)
        self.step_pres_cpu = torch.zeros(max_bs, dtype=torch.float32, pin_memory=True)
        self.slot_rep_np = np.ones(max_bs, dtype=np.float32)
        self.slot_freq_np = np.zeros(max_bs, dtype=np.float32)
        self.slot_pres_np = np.zeros(max_bs, dtype=np.float32)
        self.penalty_flags_np = np.zeros(max_bs, dtype=np.bool_)
        self.batch_slots_cpu = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.has_penalty_cpu = torch.zeros(max_bs, dtype=torch.bool, pin_memory=True)
        self.slot_of: Dict[str, int] = {}
        self._num_active = 0

    # ------------------------------------------------------------- admission
    def add_request(self, rid: str, slot: int, prompt_ids: torch.Tensor, params: SamplingParams) -> None:
        assert 0 <= slot < self.max_batch_size, "slot out of range"  # expect: FC109
        self.slot_of[rid] = slot
        self.output_counts[slot].zero_()
        self.prompt_mask[slot].zero_()
        self.prompt_mask[slot].index_fill_(0, prompt_ids.to(self.device, non_blocking=True), True)
        self.slot_rep_np[slot] = params.repetition_penalty
        self.slot_freq_np[slot] = params.frequency_penalty
        self.slot_pres_np[slot] = params.presence_penalty
        self.penalty_flags_np[slot] = params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        self._num_active += 1

    def _release(self, slot: int) -> None:
        assert self._num_active > 0, "release without a matching add"  # ok: FC109
        self._num_active -= 1
        self.penalty_flags_np[slot] = False

    def remove_request(self, rid: str) -> None:
        slot = self.slot_of.pop(rid, None)
        if slot is not None:
            self._release(slot)

    # --------------------------------------------------------------- per step
    @property
    def num_penalized(self) -> int:
        """Rows of the current batch with any penalty (for the step metrics)."""
        return int(self.has_penalty.sum())  # expect: FC101

    def any_penalty(self, slots_np: np.ndarray) -> bool:
        return bool(self.penalty_flags_np[slots_np].any())  # ok: FC101

    def stage_batch(self, slots_np: np.ndarray, bucket: int) -> None:
        """Gather the batch's penalty factors into the vectors the graph reads."""
        bs = slots_np.shape[0]
        self.batch_slots_cpu[:bs] = torch.from_numpy(slots_np)
        self.batch_slots_cpu[bs:bucket] = 0
        self.batch_slots[:bucket].copy_(self.batch_slots_cpu[:bucket], non_blocking=True)
        self.step_rep_cpu[:bs] = torch.from_numpy(self.slot_rep_np[slots_np])
        self.step_freq_cpu[:bs] = torch.from_numpy(self.slot_freq_np[slots_np])
        self.step_pres_cpu[:bs] = torch.from_numpy(self.slot_pres_np[slots_np])
        self.has_penalty_cpu[:bs] = torch.from_numpy(self.penalty_flags_np[slots_np])
        self.has_penalty[:bs].copy_(self.has_penalty_cpu[:bs], non_blocking=True)
        if not self.has_penalty[:bs].any():  # expect: FC101
            return
        for name in self._STEP_VECTORS:
            # sized to the bucket so the padded rows are neutral
            setattr(self, name, torch.empty(bucket, dtype=torch.float32, device=self.device))  # expect: FC107
            getattr(self, name)[:bs].copy_(getattr(self, name + "_cpu")[:bs], non_blocking=True)

    def record_tokens(self, next_ids: torch.Tensor, bs: int) -> None:
        ones = torch.ones(bs, dtype=torch.int32, device=self.device)
        self.output_counts.index_put_((self.batch_slots[:bs], next_ids[:bs]), ones, accumulate=True)

    # ----------------------------------------------------------- in the graph
    def apply(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        slots = self.batch_slots[:bs]
        counts = self.output_counts.index_select(0, slots)
        seen = self.prompt_mask.index_select(0, slots) | (counts > 0)
        rep = self.step_rep[:bs, None]
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        logits = logits - self.step_freq[:bs, None] * counts - self.step_pres[:bs, None] * (counts > 0)
        return logits
