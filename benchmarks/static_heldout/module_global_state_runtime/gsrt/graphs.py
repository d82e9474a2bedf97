"""Decode CUDA graphs, one per bucket size, kept in the module-level _GRAPHS dict.

warmup_graphs() records them at start-up; replay() refreshes the graph-bound globals of gsrt.state and
replays the bucket's graph.
"""
import logging

import torch

from . import attn as A
from . import config as C
from . import model as M
from . import plan as P
from . import state as S
from . import wrappers as W

logger = logging.getLogger(__name__)

_GRAPHS = {}
_POOL = None


class GraphEntry:
    """One captured bucket: the graph, its graph-mode wrapper and its static output."""

    __slots__ = ("graph", "wrapper", "bs", "logits", "temperature")

    def __init__(self, graph: torch.cuda.CUDAGraph, wrapper, bs):
        self.graph = graph
        self.wrapper = wrapper
        self.bs = bs
        self.logits = None
        self.temperature = None


def bucket_for(bs):
    for gbs in sorted(_GRAPHS):
        if gbs >= bs:
            return gbs
    return None


def _check_graph_inputs():
    assert S.kv_indptr.shape[0] >= S.max_bs + 1, "page-table globals were re-allocated after init_buffers()"  # ok: FC109


def _check_bucket(gbs):
    assert gbs in _GRAPHS, f"no decode graph was recorded for bucket {gbs}"  # expect: FC109


def _dummy_page_table(gbs):
    """One page (the null page) and one token per row: what every bucket is recorded with."""
    S.kv_indptr_cpu[: gbs + 1] = torch.arange(gbs + 1, dtype=torch.int32)
    S.kv_indices_cpu[:gbs] = C.NULL_PAGE
    S.kv_last_page_len_cpu[:gbs] = 1
    S.qo_indptr_cpu[: gbs + 1] = torch.arange(gbs + 1, dtype=torch.int32)
    S.sfx_kv_indptr_cpu[: gbs + 1] = 0
    S.seq_lens_cpu[:gbs] = 1
    S.block_tables_cpu[:gbs, 0] = C.NULL_PAGE


def _record_one(gbs):
    entry = GraphEntry(torch.cuda.CUDAGraph(), W.make_graph_wrapper(gbs), gbs)
    if not entry.wrapper.is_cuda_graph_enabled:  # ok: FC103
        raise RuntimeError("make_graph_wrapper() returned a wrapper outside CUDA-graph mode")

    _dummy_page_table(gbs)
    S.kv_indptr[: gbs + 1].copy_(S.kv_indptr_cpu[: gbs + 1])  # ok: FC104
    S.kv_indices[:gbs].copy_(S.kv_indices_cpu[:gbs])
    S.kv_last_page_len[:gbs].copy_(S.kv_last_page_len_cpu[:gbs])
    S.seq_lens[:gbs].copy_(S.seq_lens_cpu[:gbs])
    S.block_tables[:gbs].copy_(S.block_tables_cpu[:gbs])
    S.input_ids[:gbs].zero_()
    S.positions[:gbs].zero_()
    S.batch_indices[:gbs].copy_(torch.arange(gbs, dtype=torch.int32))
    # the direct trtllm-gen kernel takes the longest sequence of the batch
    S._STATE["max_seq_len"] = int(S.seq_lens[:gbs].max().item())  # expect: FC101
    S._STATE["use_cascade"] = C.SHARED_PREFIX_LEN > 0

    entry.wrapper.plan(  # ok: FC102
        S.kv_indptr_cpu[: gbs + 1],
        S.kv_indices[:gbs],
        S.kv_last_page_len_cpu[:gbs],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        q_data_type=S.DTYPE,
        kv_data_type=S.DTYPE,
    )
    P.plan_swa(gbs)
    if not C.LONG_DECODE_DIRECT:
        P.plan_long(gbs)
    if S._STATE["use_cascade"]:
        P.plan_cascade(gbs)

    entry.temperature = torch.ones(gbs, dtype=torch.float32, device=S.DEVICE)  # ok: FC107
    A.set_active(decode=entry.wrapper, swa=W.swa_decode_wrapper)

    torch.cuda.synchronize()
    M.decode_forward(gbs, capturing=True)  # warm-up: lazy kernels and autotuning outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(entry.graph, pool=_POOL):
        logits = M.decode_forward(gbs, capturing=True)
        entry.logits = logits / entry.temperature.clamp(min=1e-5).unsqueeze(1)
    _GRAPHS[gbs] = entry


def warmup_graphs(batch_sizes):
    """Record one decode graph per bucket, largest first so the pool is sized by the first."""
    global _POOL
    _check_graph_inputs()
    S.init_graph_state()
    torch.cuda.synchronize()  # ok: FC101
    _POOL = torch.cuda.graph_pool_handle()
    for gbs in sorted(batch_sizes, reverse=True):
        if gbs > S.max_bs:
            logger.warning("skipping bucket %d > max_bs %d", gbs, S.max_bs)
            continue
        _record_one(gbs)
    torch.cuda.synchronize()
    logger.info("recorded %d decode graphs: %s", len(_GRAPHS), sorted(_GRAPHS))


def refresh_graph_inputs(bs, gbs):
    """Copy the host page table of this step into the graph-bound globals and re-plan the bucket."""
    entry = _GRAPHS[gbs]
    nnz = int(S.kv_indptr_cpu[gbs])  # ok: FC101
    key = (bs, nnz, S._STATE["page_epoch"])
    if S._STATE["plan_key"].get(gbs) == key and entry.wrapper._plan_info is not None:  # expect: FC103
        # same pages as the bucket's last plan: only the last pages grew
        S.kv_last_page_len[:gbs].copy_(S.kv_last_page_len_cpu[:gbs], non_blocking=True)
        return
    # the previous replay may still read the page table
    torch.cuda.synchronize()  # expect: FC101
    S.ensure_device_capacity(nnz)
    S.kv_indptr[: gbs + 1].copy_(S.kv_indptr_cpu[: gbs + 1], non_blocking=True)  # ok: FC104
    S.kv_indices[:nnz].copy_(S.kv_indices_cpu[:nnz], non_blocking=True)
    S.kv_last_page_len[:gbs].copy_(S.kv_last_page_len_cpu[:gbs], non_blocking=True)
    entry.wrapper.plan(  # ok: FC102
        S.kv_indptr_cpu[: gbs + 1],
        S.kv_indices[:nnz],
        S.kv_last_page_len_cpu[:gbs],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        q_data_type=S.DTYPE,
        kv_data_type=S.DTYPE,
    )
    P.plan_swa(gbs)
    if not C.LONG_DECODE_DIRECT:
        P.plan_long(gbs)
    if S._STATE["use_cascade"]:
        P.plan_cascade(gbs)
    S._STATE["plan_key"][gbs] = key
    # padded rows hold only the null page and no tokens; a last page of 1 keeps the kernel off empty rows
    S.kv_last_page_len[bs:gbs].fill_(1)  # expect: FC104
    # rows past the bucket stay at the total, so the next larger bucket starts from a monotone mirror
    S.kv_indptr_cpu[gbs + 1 :] = nnz  # ok: FC104


def replay(bs, gbs):
    """Run the decode graph of bucket ``gbs`` for a batch of ``bs`` rows; returns the real rows' logits."""
    _check_bucket(gbs)
    if S._STATE["finished"][:bs].all():  # expect: FC101
        return None
    entry = _GRAPHS[gbs]
    refresh_graph_inputs(bs, gbs)
    entry.temperature = S._STATE["temperature"][:gbs].clone()  # expect: FC107
    entry.graph.replay()
    return entry.logits[:bs]


def drop_graphs():
    """Forget every graph (before a KV-pool resize); warmup_graphs() records them again."""
    _GRAPHS.clear()
    S._STATE["plan_key"].clear()
