"""Factory and graph tests (need a GPU)."""

import numpy as np
import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from dynserve.attention.factory import make_backend
from dynserve.attention.features import DecodeFeature, GraphFeature, PrefillFeature
from dynserve.config import EngineConfig
from dynserve.forward_batch import ForwardBatch, ForwardMode
from dynserve.kv_pool import PagedKVPool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cfg(**kw) -> EngineConfig:
    base = dict(model_path="dummy", num_layers=2, num_pages=256, max_batch_size=8,
                cuda_graph_batch_sizes=(1, 2, 4, 8), max_context_len=1024)
    base.update(kw)
    return EngineConfig(**base)


def _decode_batch(bs: int, seq_len: int, device="cuda") -> ForwardBatch:
    lens = np.full(bs, seq_len, dtype=np.int32)
    pages = (seq_len + 15) // 16
    table = np.arange(bs * pages, dtype=np.int32).reshape(bs, pages)
    lens_cpu = torch.from_numpy(lens)
    qo_cpu = torch.arange(bs + 1, dtype=torch.int32)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=bs, num_tokens=bs,
        input_ids=torch.zeros(bs, dtype=torch.int64, device=device),
        positions=torch.full((bs,), seq_len - 1, dtype=torch.int64, device=device),
        out_cache_loc=torch.zeros(bs, dtype=torch.int64, device=device),
        seq_lens=lens_cpu.to(device), seq_lens_cpu=lens_cpu,
        qo_indptr=qo_cpu.to(device), qo_indptr_cpu=qo_cpu, page_table_cpu=table,
    )


def test_mro_puts_graph_before_decode():
    cfg = _cfg()
    backend = make_backend(cfg, DecodeFeature, PrefillFeature, GraphFeature, kv_pool=PagedKVPool(cfg))
    names = [k.__name__ for k in type(backend).__mro__]
    assert names.index("GraphFeature") < names.index("DecodeFeature")  # ok: FC109
    assert hasattr(backend, "init_forward_metadata_replay_cuda_graph")


def test_replay_metadata_pads_rows():
    cfg = _cfg()
    backend = make_backend(cfg, DecodeFeature, GraphFeature, kv_pool=PagedKVPool(cfg))
    backend.init_forward_metadata_replay_cuda_graph(4, _decode_batch(3, 40))
    assert backend.graph_wrappers[4]._plan_info is not None  # ok: FC103
    assert backend.kv_indptr[4].item() == backend.kv_indptr[3].item()  # ok: FC101
    assert backend.debug_dump()["kv_last_page_len"][3] == 1


def test_decode_plan_accepts_device_indptr():
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 2, 5], dtype=torch.int32, device="cuda")
    w.plan(indptr, torch.arange(5, dtype=torch.int32, device="cuda"),  # ok: FC102
           torch.tensor([3, 16], dtype=torch.int32, device="cuda"), 32, 8, 128, 16)


def test_trtllm_decode_matches_reference():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    tables = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([50, 64], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        query=q, kv_cache=kv, workspace_buffer=ws, block_tables=tables, seq_lens=lens,
        max_seq_len=64, bmm1_scale=128 ** -0.5, bmm2_scale=1.0,
    )
    assert out.shape == q.shape
