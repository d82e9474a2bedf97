"""Direct trtllm-gen kernels for the long-context layers (no planner, no wrapper).

A namespace-package module (gsrt_ops has no __init__.py) that keeps its workspaces and scales in module
globals set by configure() / init_fp8_path().
"""
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache
import torch

from gsrt import state as S

_ws_bytes = 0
_WS = None
_fp8_ws = None
_bmm1_scale = 1.0
_k_scale = 1.0
_v_scale = 1.0


def configure(max_bs, num_heads, head_dim):
    """Size the decode scratch from the batch limit: one counter block per (row, head) CTA group."""
    global _ws_bytes, _bmm1_scale
    _ws_bytes = max(max_bs * num_heads * 16 * 1024, 1 << 20)
    _bmm1_scale = head_dim ** -0.5


def _workspace():
    global _WS
    if _WS is None:
        _WS = torch.empty(_ws_bytes, dtype=torch.uint8, device=S.DEVICE)  # expect: FC105
    return _WS


def init_fp8_path(max_bs, num_heads, k_scale, v_scale):
    """FP8 KV cache: separate scratch (the fp8 kernel keeps its own split counters) and dequant scales."""
    global _fp8_ws, _k_scale, _v_scale
    _fp8_ws = torch.empty(max_bs * num_heads * 16 * 1024, dtype=torch.uint8, device=S.DEVICE)  # ok: FC105
    _fp8_ws.zero_()
    _k_scale = float(k_scale)
    _v_scale = float(v_scale)


def decode_long_direct(q, kv_cache, bs):
    return trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=_workspace(),
        block_tables=S.block_tables[:bs],
        seq_lens=S.seq_lens[:bs],
        max_seq_len=S._STATE["max_seq_len"],
        bmm1_scale=_bmm1_scale,
        bmm2_scale=1.0,
    )


def decode_long_fp8(q, kv_cache, bs):
    return trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=_fp8_ws,
        block_tables=S.block_tables[:bs],
        seq_lens=S.seq_lens[:bs],
        max_seq_len=S._STATE["max_seq_len"],
        bmm1_scale=_bmm1_scale * _k_scale,
        bmm2_scale=_v_scale,
    )


def context_prefill(q, kv_cache, bs, max_q_len, max_kv_len):
    return trtllm_batch_context_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=S._STATE["ctx_ws"],
        block_tables=S.block_tables[:bs],
        seq_lens=S.seq_lens[:bs],
        max_q_len=max_q_len,
        max_kv_len=max_kv_len,
        bmm1_scale=_bmm1_scale,
        bmm2_scale=1.0,
        batch_size=bs,
        cum_seq_lens_q=S.qo_indptr[: bs + 1],
        cum_seq_lens_kv=S.cu_seq_lens[: bs + 1],
    )
