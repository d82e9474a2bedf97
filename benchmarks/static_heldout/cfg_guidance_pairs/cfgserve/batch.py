from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper


@dataclass
class PromptBatch:
    """New pairs to prefill: conditional prompts, then unconditional ones."""

    req_ids: list[str]
    slots_np: np.ndarray
    cond_lens_np: np.ndarray
    uncond_lens_np: np.ndarray
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    last_token_idx: torch.Tensor


@dataclass
class DecodeBatch:
    req_ids: list[str]
    num_pairs: int
    slots_np: np.ndarray
    slots_gpu: torch.Tensor
    steps_np: np.ndarray
    steps_gpu: torch.Tensor
    guidance_np: np.ndarray
    temperature_np: np.ndarray
    greedy_mask_gpu: torch.Tensor
    cond_input_ids: torch.Tensor
    uncond_input_ids: torch.Tensor
    cond_positions: torch.Tensor
    uncond_positions: torch.Tensor
    slot_mapping: torch.Tensor
    guided: Optional[torch.Tensor] = None


@dataclass
class PairDecodeMeta:
    num_pairs: int
    padded: int
    cond_wrapper: BatchDecodeWithPagedKVCacheWrapper
    slot_mapping: torch.Tensor
    kv_indptr_cpu: Optional[torch.Tensor] = None
    kv_indices: Optional[torch.Tensor] = None
    last_page_len: Optional[torch.Tensor] = None


@dataclass
class PrefillMeta:
    num_rows: int
    slot_mapping: torch.Tensor
