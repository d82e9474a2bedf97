"""Model shape, serving limits and the per-step batch of the Gemma engine."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch


class LayerType(str, enum.Enum):
    SLIDING = "sliding_attention"
    GLOBAL = "full_attention"


# Row of the per-layer-type graph buffers (kv_indptr / kv_indices are 2-D, one row per type).
LAYER_ROW = {LayerType.SLIDING: 0, LayerType.GLOBAL: 1}


@dataclass
class GemmaConfig:
    num_layers: int = 26
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_qo_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 256
    vocab_size: int = 256000
    query_pre_attn_scalar: float = 256.0
    sliding_window: int = 4096
    # Gemma-2 alternates local and global layers 1:1, Gemma-3 puts one global layer after five local ones.
    global_every: int = 2
    # Gemma-2 caps attention logits at 50 and final logits at 30; Gemma-3 drops the attention cap.
    attn_logit_softcap: Optional[float] = 50.0
    final_logit_softcap: Optional[float] = 30.0
    rms_norm_eps: float = 1e-6
    page_size: int = 16
    max_batch_size: int = 128
    max_context_len: int = 8192
    max_prefill_tokens: int = 16384
    batch_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    use_tc_for_global: bool = False

    def __post_init__(self) -> None:
        if self.batch_buckets[-1] > self.max_batch_size:
            raise ValueError(f"largest bucket {self.batch_buckets[-1]} > max_batch_size={self.max_batch_size}")

    def layer_type(self, layer_id: int) -> LayerType:
        return LayerType.GLOBAL if (layer_id + 1) % self.global_every == 0 else LayerType.SLIDING

    @property
    def max_pages_per_seq(self) -> int:
        return math.ceil(self.max_context_len / self.page_size)

    def bucket_for(self, batch_size: int) -> Optional[int]:
        return next((bs for bs in self.batch_buckets if bs >= batch_size), None)


@dataclass(frozen=True)
class PlanParams:
    """What differs between the two layer types when FlashInfer plans them."""

    window_left: int
    logits_soft_cap: float
    sm_scale: float


def plan_params_for(cfg: GemmaConfig, layer_type: LayerType) -> PlanParams:
    window_left = cfg.sliding_window - 1 if layer_type is LayerType.SLIDING else -1
    # FlashInfer treats a cap of 0.0 as "no soft-capping"
    cap = cfg.attn_logit_softcap or 0.0
    return PlanParams(window_left=window_left, logits_soft_cap=cap, sm_scale=cfg.query_pre_attn_scalar**-0.5)


def window_page_range(seq_len: int, window: int, page_size: int) -> Tuple[int, int]:
    """First page and one-past-last page that a sliding layer reads for ``seq_len`` cached tokens."""
    assert window > 0, "sliding layers need a positive window"  # expect: FC109
    first_token = max(seq_len - window, 0)
    return first_token // page_size, (seq_len + page_size - 1) // page_size


@dataclass
class StepBatch:
    """One forward step: device tensors for the kernels, host copies for planning.

    ``extend_lens`` is set for a prefill (extend) step and ``None`` for a decode step.
    """

    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    page_table_np: np.ndarray
    extend_lens: Optional[torch.Tensor] = None
