"""GPU tests of the clone contract: copy.copy shares buffers, copy.deepcopy re-creates them."""

from __future__ import annotations

import copy

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from protoserve.buffers import DecodeBuffers
from protoserve.config import EngineConfig
from protoserve.metadata import StepMetadata, for_bucket

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

DEV = torch.device("cuda")


def _bufs(max_bs: int = 8, max_pages: int = 256) -> DecodeBuffers:
    return DecodeBuffers(max_bs, max_pages, DEV)


def test_shallow_copy_shares_storage():
    bufs = _bufs()
    shallow = copy.copy(bufs)
    deep = copy.deepcopy(bufs)
    assert shallow.kv_indices.data_ptr() == bufs.kv_indices.data_ptr()  # ok: FC109
    assert deep.kv_indices.data_ptr() != bufs.kv_indices.data_ptr()
    deep.kv_indices[:4] = 7
    assert bufs.kv_indices[:4].sum().item() == 0  # ok: FC101


def test_record_copy_keeps_views():
    bufs = _bufs()
    template = StepMetadata.over(bufs)
    meta = for_bucket(template, 3, 4)
    assert meta.kv_indptr is bufs.kv_indptr
    assert meta.bucket == 4 and template.bucket == bufs.max_bs


def test_graph_wrapper_plan_then_padding():
    bufs = _bufs()
    ws = torch.zeros(32 << 20, dtype=torch.uint8, device=DEV)
    bs = 4
    w = BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "NHD",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
        paged_kv_indices_buffer=bufs.kv_indices,
        paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
    )
    indptr = torch.arange(bs + 1, dtype=torch.int32, device=DEV)
    last = torch.ones(bs, dtype=torch.int32, device=DEV)
    w.plan(indptr, bufs.kv_indices[:bs], last, 8, 8, 128, 16)  # ok: FC102
    bufs.kv_last_page_len[2:bs].zero_()  # ok: FC104
    assert w._fixed_batch_size == bs  # ok: FC103


def test_eager_wrapper_in_graph_is_rejected():
    ws = torch.zeros(32 << 20, dtype=torch.uint8, device=DEV)
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.arange(3, dtype=torch.int32)
    w.plan(indptr, torch.zeros(2, dtype=torch.int32, device=DEV), torch.ones(2, dtype=torch.int32), 8, 8, 128, 16)
    q = torch.randn(2, 8, 128, dtype=torch.float16, device=DEV)
    kv = torch.randn(4, 2, 16, 8, 128, dtype=torch.float16, device=DEV)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError):
        with torch.cuda.graph(g):
            w.run(q, kv)  # ok: FC108


def test_trtllm_decode_with_zeroed_workspace():
    cfg = EngineConfig(model_path="dummy", max_batch_size=8, cuda_graph_buckets=(1, 2, 4, 8))
    ws = torch.empty(cfg.workspace_bytes, dtype=torch.uint8, device=DEV)  # ok: FC105
    ws.zero_()
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device=DEV)
    kv = torch.randn(4, 2, 8, 16, 128, dtype=torch.bfloat16, device=DEV)
    out = trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=kv,
        workspace_buffer=ws,
        block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEV),
        seq_lens=torch.tensor([20, 9], dtype=torch.int32, device=DEV),
        max_seq_len=32,
        bmm1_scale=128**-0.5,
        bmm2_scale=1.0,
    )
    assert out.shape == q.shape
