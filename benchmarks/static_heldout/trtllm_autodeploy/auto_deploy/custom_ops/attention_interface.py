"""Attention interface: ``SequenceInfo`` (device tensors + host mirrors) and the descriptor registry."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type

import numpy as np
import torch
from torch.fx import Node

BufferInitializerDict = Dict[str, Callable[["SequenceInfo"], torch.Tensor]]
CacheInitializerDict = Dict[str, Callable[["SequenceInfo"], torch.Tensor]]


@dataclass
class SequenceInfo:
    """Per-engine sequence state; the graph reads ``args`` by address, the planner reads the host mirrors."""

    max_seq_len: int = 1
    max_batch_size: int = 1
    page_size: int = 0
    max_num_tokens: int = 0
    device: str = "cuda"

    def __post_init__(self):
        if self.page_size < 1:
            self.page_size = self.max_seq_len
        self.max_num_tokens = self.max_num_tokens or self.max_batch_size * self.max_seq_len
        self.num_pages = math.ceil(self.max_num_tokens / self.page_size) + self.max_batch_size
        self._input_ids_flat = torch.zeros(self.max_num_tokens, dtype=torch.int, device=self.device)
        self.input_ids = self._input_ids_flat[: self.max_batch_size].view(self.max_batch_size, 1)
        self.position_ids = torch.zeros(self.max_batch_size, 1, dtype=torch.long, device=self.device)
        self.seq_len = torch.zeros(self.max_batch_size, dtype=torch.int, device=self.device)
        self.input_pos = torch.zeros_like(self.seq_len)
        self.cache_loc = torch.zeros(self.num_pages, dtype=torch.int, device=self.device)
        self.pages_per_seq = torch.zeros_like(self.seq_len)
        # host mirrors (filled from the scheduler's lists, read by plan())
        self._seq_len_host = torch.zeros(self.max_batch_size, dtype=torch.int)
        self._input_pos_host = np.zeros(self.max_batch_size, dtype=np.int32)
        self._pages_per_seq_host = np.zeros(self.max_batch_size, dtype=np.int32)
        self.qo_indptr_host = torch.zeros(self.max_batch_size + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(self.max_batch_size + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.zeros(self.max_batch_size, dtype=torch.int32, pin_memory=True)

    @property
    def num_sequences(self) -> int:
        return (self.seq_len > 0).sum().item()  # expect: FC101

    @property
    def num_sequences_host(self) -> int:
        return int((self._seq_len_host > 0).sum())  # ok: FC101

    @property
    def sequence_lengths(self) -> List[int]:
        return self.seq_len[: self.num_sequences].tolist()  # expect: FC101

    @property
    def is_generate(self) -> bool:
        return self.input_ids.shape[1] == 1

    @property
    def args(self) -> Tuple[torch.Tensor, ...]:
        return (self.input_ids, self.position_ids, self.seq_len, self.input_pos, self.cache_loc, self.pages_per_seq)

    @property
    def host_plan_args(self) -> Tuple[torch.Tensor, ...]:
        n = self.num_sequences_host
        return (self.qo_indptr_host[: n + 1], self.kv_indptr_host[: n + 1], self.last_page_len_host[:n])

    @staticmethod
    def _get_sanitized_num_sequences(input_ids: torch.Tensor, seq_len: torch.Tensor) -> int:
        b, s = input_ids.shape[:2]
        if s > 1:
            num_seq = torch.sum(seq_len > 0)
            assert seq_len[num_seq:].sum() == 0, "Invalid seq_len"  # expect: FC101, FC109
            return int(num_seq)  # expect: FC101
        return b

    def reset(self) -> None:
        self.seq_len.zero_()
        self.input_pos.zero_()
        self._seq_len_host.zero_()

    def nest_sequences(self, input_ids: Sequence[Sequence[int]]) -> None:
        seq_lens = [len(ids) for ids in input_ids]
        bs = len(seq_lens)
        self._seq_len_host = torch.tensor(seq_lens + [0] * (self.max_batch_size - bs), dtype=torch.int)  # ok: FC107
        self.seq_len.copy_(self._seq_len_host, non_blocking=True)
        max_s = max(seq_lens)  # ok: FC101
        padded = [list(ids) + [0] * (max_s - len(ids)) for ids in input_ids]
        self._input_ids_flat[: bs * max_s].copy_(torch.tensor(padded, dtype=torch.int).flatten(), non_blocking=True)
        self.input_ids = self._input_ids_flat[: bs * max_s].view(bs, max_s)  # ok: FC107

    def update_pos(self, input_pos: Sequence[int], reset: bool = False) -> None:
        n = len(input_pos)
        if reset:
            self._input_pos_host[:] = 0
        self._input_pos_host[:n] += np.asarray(input_pos, dtype=np.int32)
        self.input_pos[:n].copy_(torch.from_numpy(self._input_pos_host[:n]), non_blocking=True)

    def assign_cache_loc(self, page_assignments: Sequence[Sequence[int]]) -> None:
        cache_loc_flat = [c for pages in page_assignments for c in pages]
        if len(cache_loc_flat) > self.cache_loc.numel():
            self.cache_loc = torch.empty(len(cache_loc_flat), dtype=torch.int, device=self.device)  # expect: FC107
        self.cache_loc[: len(cache_loc_flat)].copy_(torch.tensor(cache_loc_flat, dtype=torch.int), non_blocking=True)
        pages_per_seq = [len(p) for p in page_assignments]
        self._pages_per_seq_host[: len(pages_per_seq)] = pages_per_seq
        self.pages_per_seq[: len(pages_per_seq)].copy_(torch.tensor(pages_per_seq, dtype=torch.int), non_blocking=True)

    def prepare_host_plan_args(self) -> None:
        n = self.num_sequences_host
        seq = self._seq_len_host[:n].numpy()
        qo = self.qo_indptr_host.numpy()
        kv = self.kv_indptr_host.numpy()
        np.cumsum(seq, out=qo[1 : n + 1])
        np.cumsum(self._pages_per_seq_host[:n], out=kv[1 : n + 1])
        self.last_page_len_host.numpy()[:n] = (self._input_pos_host[:n] + seq - 1) % self.page_size + 1

    def unnest_sequences(self, t: torch.Tensor) -> List[torch.Tensor]:
        t_squeezed = t.squeeze(1) if self.is_generate else t
        return list(torch.split(t_squeezed, self.sequence_lengths))


class AttentionDescriptor(ABC):
    """What the cache-insertion transform needs to know about an attention backend."""

    @classmethod
    @abstractmethod
    def get_cached_attention_op(cls) -> Callable: ...

    @classmethod
    @abstractmethod
    def get_prepare_metadata_op(cls) -> Tuple[Callable, int]: ...

    @classmethod
    @abstractmethod
    def get_cache_initializers(cls, source_attn_node: Node) -> CacheInitializerDict: ...

    @classmethod
    def get_global_buffer_initializers(cls, source_attn_node: Node) -> BufferInitializerDict:
        return {}

    @classmethod
    def get_constants(cls, source_attn_node: Node) -> List:
        return []


class AttentionRegistry:
    _attention_registry: Dict[str, Type[AttentionDescriptor]] = {}

    @classmethod
    def register(cls, kernel_source: str) -> Callable[[Type[AttentionDescriptor]], Type[AttentionDescriptor]]:
        assert kernel_source not in cls._attention_registry, f"Attention source {kernel_source} already registered."  # expect: FC109

        def decorator(attention_cls: Type[AttentionDescriptor]) -> Type[AttentionDescriptor]:
            cls._attention_registry[kernel_source] = attention_cls
            return attention_cls

        return decorator

    @classmethod
    def get(cls, kernel_source: str) -> Type[AttentionDescriptor]:
        if kernel_source not in cls._attention_registry:
            raise KeyError(f"attention source {kernel_source!r} is not registered; have {sorted(cls._attention_registry)}")
        return cls._attention_registry[kernel_source]


def get_page_size(si: Optional[SequenceInfo]) -> int:
    return si.page_size if si is not None else 0
