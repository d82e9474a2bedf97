"""Attention entry points of the model, one per layer kind.

The decode wrappers in use are module globals too: set_active() points them at the graph wrapper of the
bucket being captured, or at the eager wrappers for a batch size without a graph.
"""
from gsrt_ops import trtllm_paths as TR

from . import config as C
from . import state as S
from . import wrappers as W

_active_decode = None
_active_swa = None


def set_active(decode=None, swa=None):
    global _active_decode, _active_swa
    if decode is not None:
        _active_decode = decode
    if swa is not None:
        _active_swa = swa


def layout_of(kind):
    """KV layout of a layer's cache: the long-context layers keep HND for trtllm-gen."""
    if kind == "global":
        return "HND"
    return W._kv_layout  # ok: FC103


def decode_attention(q, kv_cache):
    return _active_decode.run(q, kv_cache)  # ok: FC108


def swa_attention(q, kv_cache):
    return _active_swa.run(q, kv_cache)  # expect: FC108


def long_attention(q, kv_cache, bs):
    """Long-context layers: trtllm-gen, through the wrapper or the direct kernel."""
    if C.LONG_DECODE_DIRECT:
        if C.KV_FP8:
            return TR.decode_long_fp8(q, kv_cache, bs)
        return TR.decode_long_direct(q, kv_cache, bs)
    if W.long_decode_wrapper._kv_layout != "HND":  # expect: FC103
        kv_cache = kv_cache.transpose(-3, -2)
    return W.long_decode_wrapper.run(q, kv_cache)  # expect: FC108


def shared_prefix_attention(q, kv_cache):
    """Full layers when every request starts with the shared system prompt."""
    return W.cascade_wrapper.run(q, kv_cache)  # expect: FC108


def extend_attention(q, kv_cache):
    """The prompt chunk that rides along a decode batch (eager steps only)."""
    return W.chunk_wrapper.run(q, kv_cache)  # ok: FC108


def prefill_attention(q, k, v):
    return W.prefill_wrapper.run(q, k, v)  # ok: FC108


def long_prefill_attention(q, kv_cache, bs):
    if C.LONG_DECODE_DIRECT:
        return TR.context_prefill(q, kv_cache, bs, S._STATE["max_q_len"], S._STATE["max_seq_len"])
    return W.long_prefill_wrapper.run(q, kv_cache)  # ok: FC108
