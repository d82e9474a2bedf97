"""Attention-backend helpers shared by every builder (vLLM v1 ``attention/backends/utils.py``)."""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import torch

from vfd.config import VllmConfig


@dataclass
class CommonAttentionMetadata:
    """Per-step metadata every builder receives; ``*_cpu`` fields are pinned host mirrors."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor


class AttentionCGSupport(enum.Enum):
    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


M = TypeVar("M")


class AttentionMetadataBuilder(abc.ABC, Generic[M]):
    cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: ClassVar[int] = 0

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config: VllmConfig, device: torch.device):
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.vllm_config = vllm_config
        self.device = device

    @abc.abstractmethod
    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False) -> M:
        raise NotImplementedError

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> M:
        return self.build(common_prefix_len=0, common_attn_metadata=common_attn_metadata)


def split_decodes_and_prefills(common_attn_metadata: CommonAttentionMetadata, decode_threshold: int = 1):
    """(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens); decodes come first in the batch."""
    max_query_len = common_attn_metadata.max_query_len
    num_reqs = common_attn_metadata.num_reqs
    num_tokens = common_attn_metadata.num_actual_tokens
    query_start_loc = common_attn_metadata.query_start_loc_cpu

    if max_query_len <= decode_threshold:
        return num_reqs, 0, num_tokens, 0

    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    is_prefill = query_lens > decode_threshold
    if not torch.any(is_prefill):  # ok: FC101
        return num_reqs, 0, num_tokens, 0

    first_prefill = is_prefill.int().argmax(dim=-1).item()  # ok: FC101
    assert torch.all(query_lens[first_prefill:] > decode_threshold)  # expect: FC109  # ok: FC101
    num_decodes = first_prefill
    num_prefills = num_reqs - num_decodes
    num_decode_tokens = query_start_loc[first_prefill].item()  # ok: FC101
    num_prefill_tokens = num_tokens - num_decode_tokens
    return num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens
