"""Deterministic planning: one split size for every batch, split-kv off."""

from typing import Any, Tuple

from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from bieval import InvariantConfig
from bi_attn.metadata import StepMeta


def invariant_kwargs(cfg: InvariantConfig) -> dict:
    return dict(fixed_split_size=cfg.fixed_split_pages * cfg.page_size, disable_split_kv=True)


def plan_prefill_fixed(w: BatchPrefillWithPagedKVCacheWrapper, meta: StepMeta, cfg: InvariantConfig,
                       split_tokens: int) -> None:
    assert split_tokens % cfg.page_size == 0, "split must cover whole pages"  # expect: FC109
    w.plan(meta.qo_indptr_cpu, meta.kv_indptr, meta.kv_indices, meta.last_page_cpu,  # expect: FC102
           cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, causal=True,
           q_data_type=cfg.dtype, fixed_split_size=split_tokens, disable_split_kv=True)


def schedule_signature(w: BatchPrefillWithPagedKVCacheWrapper) -> Tuple[Any, ...]:
    # the checker wants the same schedule for a request alone and in a batch
    return tuple(w._plan_info)  # expect: FC103


def kernel_fingerprint(w: BatchPrefillWithPagedKVCacheWrapper) -> str:
    module = getattr(w, "_cached_module", None)  # expect: FC103
    return getattr(module, "__name__", "unknown")
