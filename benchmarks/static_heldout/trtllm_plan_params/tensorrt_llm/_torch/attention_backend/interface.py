"""Backend-independent attention metadata: host sequence lengths, their device twins, plan keys."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Optional

import torch

if TYPE_CHECKING:
    from tensorrt_llm._torch.pyexecutor.resource_manager import KVCacheManager


class PlanParams(NamedTuple):
    """Key of one planned wrapper set: layers that share head layout, dtype and window share a plan."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    window_left: int = -1
    sm_scale: Optional[float] = None


class KVCacheParams(NamedTuple):
    use_cache: bool
    num_cached_tokens_per_seq: list
    block_ids_per_seq: Optional[list] = None


@dataclass(kw_only=True)
class AttentionMetadata:
    max_num_requests: int
    max_num_tokens: int
    kv_cache_manager: Optional["KVCacheManager"] = None
    is_cuda_graph: bool = False
    # host tensors the executor sets before every step
    seq_lens: Optional[torch.Tensor] = None
    encoder_lens: Optional[torch.Tensor] = None
    num_contexts: int = 0
    request_ids: list = field(default_factory=list)
    kv_cache_params: Optional[KVCacheParams] = None

    def __post_init__(self) -> None:
        mgr = self.kv_cache_manager
        # the manager outlives no metadata object; a strong reference would keep its pools alive in tests
        self._kv_mgr_ref = weakref.ref(mgr) if mgr is not None else None
        self.kv_cache_manager = None
        n = self.max_num_requests
        self.seq_lens_cuda = torch.zeros(n, dtype=torch.int32, device="cuda")
        self.kv_lens_cuda = torch.zeros(n, dtype=torch.int32, device="cuda")
        self.kv_lens_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.num_ctx_tokens = 0
        self.max_kv_len = 0

    @property
    def kv_cache_manager_live(self) -> Optional["KVCacheManager"]:
        return self._kv_mgr_ref() if self._kv_mgr_ref is not None else None

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_generations(self) -> int:
        return self.num_seqs - self.num_contexts

    @property
    def token_split(self) -> tuple[int, int]:
        """(context tokens, generation tokens) of this step, from the host lengths."""
        ctx = int(self.seq_lens[: self.num_contexts].sum())  # ok: FC101
        return ctx, self.num_generations

    @property
    def cached_token_split(self) -> tuple[int, int]:
        """(cached tokens of context requests, cached tokens of generation requests)."""
        nc, n = self.num_contexts, self.num_seqs
        return int(self.kv_lens_cuda[:nc].sum()), int(self.kv_lens_cuda[nc:n].sum())  # expect: FC101

    def prepare(self) -> None:
        """Copy this step's host lengths to their device twins; subclasses extend it and plan."""
        n = self.num_seqs
        self.seq_lens_cuda[:n].copy_(self.seq_lens, non_blocking=True)
        cached = torch.tensor(self.kv_cache_params.num_cached_tokens_per_seq, dtype=torch.int32)
        self.kv_lens_host[:n] = cached + self.seq_lens
        self.kv_lens_cuda[:n].copy_(self.kv_lens_host[:n], non_blocking=True)
        self.num_ctx_tokens, _ = self.token_split
        self.max_kv_len = int(self.kv_lens_host[:n].max()) if n else 0  # ok: FC101
