"""Which FlashInfer kernels serve which kind of forward, and the planners that prepare them."""
from __future__ import annotations

import enum
import functools
import time
from typing import TYPE_CHECKING, Callable, Dict

if TYPE_CHECKING:
    from mlc_serve.kv_state import PagedKVCache


class ForwardKind(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    SPEC_VERIFY = "spec_verify"  # token-tree verification under a custom mask


class DecodeBackend(enum.Enum):
    FA2 = "fa2"
    TRTLLM_GEN = "trtllm-gen"
    XQA = "xqa"


_PLANNERS: Dict[ForwardKind, Callable[["PagedKVCache", int], None]] = {}


def register_planner(kind: ForwardKind):
    def deco(fn):
        @functools.wraps(fn)
        def timed(cache: "PagedKVCache", n: int) -> None:
            t0 = time.perf_counter()
            fn(cache, n)
            cache.plan_seconds += time.perf_counter() - t0

        _PLANNERS[kind] = timed
        return timed

    return deco


def run_planner(kind: ForwardKind, cache: "PagedKVCache", n: int) -> None:
    _PLANNERS[kind](cache, n)


@register_planner(ForwardKind.DECODE)
def plan_decode(cache: "PagedKVCache", n: int) -> None:
    if cache.cfg.decode_backend is not DecodeBackend.FA2:
        return  # trtllm-gen and XQA read the block table directly
    cfg = cache.cfg
    wrapper = cache.graph_decode_wrappers.get(n, cache.decode_wrapper)
    wrapper.plan(  # ok: FC102
        cache.page_indptr_host[: n + 1],
        cache.page_indices_gpu,
        cache.last_page_len_host[:n],
        cfg.num_qo_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.page_size,
        non_blocking=True,
    )
    cache.note_plan(ForwardKind.DECODE, n)


@register_planner(ForwardKind.PREFILL)
def plan_prefill(cache: "PagedKVCache", n: int) -> None:
    cfg = cache.cfg
    cache.prefill_wrapper.plan(  # expect: FC102
        cache.qo_indptr_gpu[: n + 1],
        cache.page_indptr_host[: n + 1],
        cache.page_indices_gpu,
        cache.last_page_len_host[:n],
        cfg.num_qo_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.page_size,
        causal=True,
    )
    cache.note_plan(ForwardKind.PREFILL, n)


@register_planner(ForwardKind.SPEC_VERIFY)
def plan_verify(cache: "PagedKVCache", n: int) -> None:
    cfg = cache.cfg
    cache.verify_wrapper.plan(  # ok: FC102
        cache.qo_indptr_host[: n + 1],
        cache.page_indptr_host[: n + 1],
        cache.page_indices_gpu,
        cache.last_page_len_host[:n],
        cfg.num_qo_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.page_size,
        custom_mask=cache.tree_mask_gpu,
    )
    cache.note_plan(ForwardKind.SPEC_VERIFY, n)
