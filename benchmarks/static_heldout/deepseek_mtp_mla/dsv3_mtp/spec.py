"""Configuration, per-round batch records and acceptance statistics of MTP speculative decoding."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np
import torch


@dataclasses.dataclass
class DeepseekV3Config:
    hidden_size: int = 7168
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    intermediate_size: int = 18432
    vocab_size: int = 129280
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    num_nextn_predict_layers: int = 1


@dataclasses.dataclass
class SpecLimits:
    max_running_requests: int = 128
    page_size: int = 64
    num_pages: int = 65536
    max_context_len: int = 163840
    num_draft_steps: int = 3
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    mla_decode_backend: str = "fa2"  # "trtllm-gen" on Blackwell

    @property
    def tokens_per_req(self) -> int:
        return self.num_draft_steps + 1

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size


@dataclasses.dataclass
class SpecBatch:
    """One verify round: the last accepted token plus num_draft_steps drafts per request."""

    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    draft_tokens: torch.Tensor  # [bs, tokens_per_req]
    positions: torch.Tensor  # [bs * tokens_per_req]
    out_cache_loc: torch.Tensor  # [bs * tokens_per_req]

    @classmethod
    def from_host(
        cls, req_pool_indices_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor, draft_tokens_cpu: torch.Tensor,
        positions_cpu: torch.Tensor, out_cache_loc_cpu: torch.Tensor, device: torch.device,
    ) -> "SpecBatch":
        """Built by the scheduler from its pinned staging buffers."""
        return cls(
            batch_size=seq_lens_cpu.numel(),
            req_pool_indices=req_pool_indices_cpu.to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            draft_tokens=draft_tokens_cpu.to(device, non_blocking=True),
            positions=positions_cpu.to(device, non_blocking=True),
            out_cache_loc=out_cache_loc_cpu.to(device, non_blocking=True),
        )


@dataclasses.dataclass
class MTPDraftInput:
    """Views of the draft graph's inputs handed back to the worker for the following draft steps."""

    kv_indptr: torch.Tensor
    kv_lens: torch.Tensor
    positions: torch.Tensor


@dataclasses.dataclass
class RoundResult:
    new_seq_lens: List[int]
    next_draft_tokens: torch.Tensor
    output_ids_ready: Optional[torch.cuda.Event] = None


class AcceptStats:
    """Host-side acceptance bookkeeping for the metrics endpoint."""

    def __init__(self, num_draft_steps: int, window: int = 1024):
        self.hist = np.zeros(num_draft_steps + 2, dtype=np.int64)
        self.window = window
        self._history: List[float] = []

    def update(self, accept_length_cpu: List[int]) -> None:
        counts = np.bincount(np.asarray(accept_length_cpu, dtype=np.int64), minlength=self.hist.size)
        self.hist += counts[: self.hist.size]
        self._history.append(float(np.mean(accept_length_cpu)))
        self._trim()

    def _trim(self) -> None:
        if len(self._history) > self.window:
            del self._history[: -self.window]
        assert len(self._history) <= self.window  # ok: FC109

    def mean_accept_length(self) -> float:
        return float(np.mean(self._history)) if self._history else 0.0
