"""FlashInfer wrappers and their workspaces, as module globals.

init_wrappers() builds the eager wrappers once; make_graph_wrapper() builds one graph-mode decode wrapper per
captured batch size, bound to the page-table globals of gsrt.state.
"""
import logging

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from . import config as C
from . import state as S

logger = logging.getLogger(__name__)

_kv_layout = "NHD"
_WS_MIB = {"swa": 128, "cascade_min": 16}
_TUNED_WS = {"long_prefill": 512 << 20}
_shared_graph_workspace = None

float_workspace = None
prefill_workspace = None
chunk_workspace = None
swa_workspace = None
cascade_workspace = None
trtllm_decode_ws = None
long_prefill_ws = None

decode_wrapper = None
prefill_wrapper = None
chunk_wrapper = None
swa_decode_wrapper = None
cascade_wrapper = None
long_decode_wrapper = None
long_prefill_wrapper = None


def tune_workspace(kind, nbytes):
    """Override a tuned workspace size (engine.setup, from the autotuner's cache)."""
    _TUNED_WS[kind] = int(nbytes)


def _graph_workspace():
    global _shared_graph_workspace
    if _shared_graph_workspace is None:
        _shared_graph_workspace = torch.zeros(C.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=S.DEVICE)  # expect: FC106
    return _shared_graph_workspace


def init_wrappers(max_num_tokens, num_heads, head_dim):
    """Build every eager wrapper and its workspace (called once from engine.setup)."""
    global float_workspace, prefill_workspace, chunk_workspace, swa_workspace, cascade_workspace
    global trtllm_decode_ws, long_prefill_ws
    global decode_wrapper, prefill_wrapper, chunk_wrapper, swa_decode_wrapper, cascade_wrapper
    global long_decode_wrapper, long_prefill_wrapper

    # decode split-k partials: (head_dim + lse) float32 per token, head and split (4 splits)
    float_workspace = torch.empty(max_num_tokens * num_heads * (head_dim + 1) * 16, dtype=torch.uint8, device=S.DEVICE)  # ok: FC105
    decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(float_workspace, _kv_layout, use_tensor_cores=True)

    prefill_workspace = torch.empty(C.PREFILL_WS_MB << 20, dtype=torch.uint8, device=S.DEVICE)  # expect: FC106
    prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(prefill_workspace, _kv_layout)

    chunk_workspace = torch.empty(C.CHUNK_WS_BYTES, dtype=torch.uint8, device=S.DEVICE)  # ok: FC106
    chunk_wrapper = BatchPrefillWithPagedKVCacheWrapper(chunk_workspace, _kv_layout)

    swa_workspace = torch.empty(_WS_MIB["swa"] << 20, dtype=torch.uint8, device=S.DEVICE)  # expect: FC106
    swa_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(swa_workspace, _kv_layout, use_tensor_cores=True)

    cascade_workspace = torch.empty(C.CASCADE_WS_BYTES, dtype=torch.uint8, device=S.DEVICE)  # ok: FC106
    cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, cascade_workspace, _kv_layout)

    # long-context ("global") layers keep an HND cache and decode on trtllm-gen
    trtllm_decode_ws = torch.empty(max_num_tokens * num_heads * 64, dtype=torch.uint8, device=S.DEVICE)  # expect: FC105
    long_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(trtllm_decode_ws, "HND", backend="trtllm-gen")

    long_prefill_ws = torch.zeros(_TUNED_WS["long_prefill"], dtype=torch.uint8, device=S.DEVICE)  # ok: FC106
    long_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(long_prefill_ws, "HND", backend="trtllm-gen")

    logger.info(
        "wrappers ready: decode=%d MiB prefill=%d MiB chunk=%d MiB swa=%d MiB cascade=%d MiB",
        float_workspace.numel() >> 20, prefill_workspace.numel() >> 20, chunk_workspace.numel() >> 20,
        swa_workspace.numel() >> 20, cascade_workspace.numel() >> 20,
    )


def make_graph_wrapper(gbs):
    """A graph-mode decode wrapper for batch size ``gbs``, bound to the page-table globals."""
    return BatchDecodeWithPagedKVCacheWrapper(
        _graph_workspace(),
        _kv_layout,
        use_cuda_graph=True,
        use_tensor_cores=True,
        paged_kv_indptr_buffer=S.kv_indptr[: gbs + 1],
        paged_kv_indices_buffer=S.kv_indices,
        paged_kv_last_page_len_buffer=S.kv_last_page_len[:gbs],
    )


def eager_wrappers():
    """(name, wrapper) pairs of the module's eager wrappers, for reports."""
    return [
        ("decode", decode_wrapper),
        ("prefill", prefill_wrapper),
        ("chunk", chunk_wrapper),
        ("swa", swa_decode_wrapper),
        ("cascade", cascade_wrapper),
        ("long_decode", long_decode_wrapper),
        ("long_prefill", long_prefill_wrapper),
    ]
