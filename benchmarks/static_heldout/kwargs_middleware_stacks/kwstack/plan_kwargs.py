"""Helpers that carry plan() keywords from the engine's call sites to FlashInfer.

The backend and the drafter keep one keyword bag per wrapper family and push it through a few generic
helpers: ``make_decode_wrapper(**kwargs)`` filters constructor keywords, ``plan_with(wrapper, **kwargs)`` pops
the keys our own layers add and forwards the rest, ``plan_via_args(wrapper, *args)`` is the positional twin,
and ``split_plan_run_kwargs`` / ``bind_plan_arguments`` use ``inspect.signature`` to sort one bag into what
``plan()`` and what ``run()`` take.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Tuple

from flashinfer import BatchDecodeWithPagedKVCacheWrapper

_DECODE_INIT_SIG = inspect.signature(BatchDecodeWithPagedKVCacheWrapper.__init__)
_DECODE_PLAN_SIG = inspect.signature(BatchDecodeWithPagedKVCacheWrapper.plan)
_DECODE_RUN_SIG = inspect.signature(BatchDecodeWithPagedKVCacheWrapper.run)

# Keys our middleware layers attach to a call; FlashInfer never sees them.
_ENGINE_ONLY_KEYS = ("trace_id", "capturing", "phase", "check_nnz")


def _accepted(sig: inspect.Signature) -> frozenset:
    assert "self" in sig.parameters, "expected an unbound method signature"  # ok: FC109
    return frozenset(name for name in sig.parameters if name != "self")


def make_decode_wrapper(workspace, kv_layout: str = "NHD", **kwargs) -> BatchDecodeWithPagedKVCacheWrapper:
    """Build a decode wrapper from a keyword bag that may also hold plan()/run() keys."""
    accepted = _accepted(_DECODE_INIT_SIG)
    init_kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    return BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout, **init_kwargs)


def split_plan_run_kwargs(bag: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Sort one keyword bag into plan() keywords and run() keywords by the wrapper's signatures."""
    plan_keys = _accepted(_DECODE_PLAN_SIG)
    run_keys = _accepted(_DECODE_RUN_SIG)
    plan_kw = {k: v for k, v in bag.items() if k in plan_keys}
    run_kw = {k: v for k, v in bag.items() if k in run_keys and k not in plan_keys}
    return plan_kw, run_kw


def bind_plan_arguments(*args, **kwargs) -> Dict[str, Any]:
    """Positional or keyword, return plan()'s arguments by name (``self`` left out)."""
    bound = _DECODE_PLAN_SIG.bind_partial(None, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self", None)
    return arguments


def plan_with(wrapper, **kwargs) -> None:
    """Plan a prefill wrapper from a keyword bag, dropping the engine's own keys first."""
    assert "qo_indptr" in kwargs and "paged_kv_indptr" in kwargs, "plan needs both indptrs"  # expect: FC109
    check_nnz = kwargs.pop("check_nnz", False)
    for key in _ENGINE_ONLY_KEYS:
        kwargs.pop(key, None)
    if check_nnz:
        nnz = kwargs["paged_kv_indptr"][-1].item()  # ok: FC101
        if nnz > kwargs["paged_kv_indices"].shape[0]:
            raise RuntimeError(f"kv indices hold {kwargs['paged_kv_indices'].shape[0]} pages, plan needs {nnz}")
    wrapper.plan(**kwargs)  # ok: FC102


def plan_via_args(wrapper, *args, **extra) -> None:
    """Positional plan: ``args`` is (indptr, indices, last_page_len) as the updater built them."""
    for key in _ENGINE_ONLY_KEYS:
        extra.pop(key, None)
    wrapper.plan(*args, **extra)  # expect: FC102


def prebind_plan(wrapper, **fixed) -> Callable[..., None]:
    """``functools.partial`` over the bound plan with the per-model keywords fixed once."""
    fixed = {k: v for k, v in fixed.items() if k not in _ENGINE_ONLY_KEYS}
    return functools.partial(wrapper.plan, **fixed)


def chain_partials(fn: Callable[..., Any], *layers: Dict[str, Any]) -> Callable[..., Any]:
    """Stack partials: later layers override earlier ones, like a ChainMap of plan keywords."""
    for layer in layers:
        fn = functools.partial(fn, **layer)
    return fn
