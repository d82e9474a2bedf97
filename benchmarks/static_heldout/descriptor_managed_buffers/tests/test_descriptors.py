"""Descriptor behaviour and kernel smoke tests (need a GPU)."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from descserve.config import EngineConfig
from descserve.descriptors import DeviceBuffer, GraphInput, HostView, PinnedMirror

TEST_WORKSPACE_BYTES = 32 * 1024 * 1024

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


class _Owner:
    buf = DeviceBuffer(lambda o: o.rows, torch.int32, fill=3)
    staged = GraphInput(lambda o: o.rows, torch.int64)
    mirror = PinnedMirror(lambda o: o.rows)
    mirror_np = HostView("mirror")

    def __init__(self, rows: int, device: str = "cuda") -> None:
        self.rows = rows
        self.device = torch.device(device)


@cuda
def test_storage_is_per_instance():
    a, b = _Owner(4), _Owner(8)
    assert a.buf.shape == (4,) and b.buf.shape == (8,)  # ok: FC109
    assert a.buf.data_ptr() != b.buf.data_ptr()
    assert a.buf.sum().item() == 12  # ok: FC101


@cuda
def test_graph_input_keeps_its_storage():
    o = _Owner(8)
    before = o.staged.data_ptr()
    o.staged = torch.arange(5, device="cuda")
    torch.cuda.synchronize()
    assert o.staged.data_ptr() == before
    assert o.staged[:5].tolist() == [0, 1, 2, 3, 4]


@cuda
def test_mirror_grows_and_keeps_contents():
    o = _Owner(4)
    o.mirror_np[:] = [1, 2, 3, 4]
    _Owner.mirror.grow(o, 16)
    assert o.mirror.is_pinned()
    assert o.mirror_np[:4].tolist() == [1, 2, 3, 4]


@cuda
def test_fa2_decode_plan_and_run():
    workspace = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    indices = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    last = torch.tensor([5, 16], dtype=torch.int32)
    w.plan(indptr, indices, last, 8, 8, 128, 16, q_data_type=torch.bfloat16)
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    assert w.run(q, kv).shape == q.shape


@cuda
def test_trtllm_decode_smoke():
    cfg = EngineConfig(num_qo_heads=8, num_kv_heads=8, max_running_requests=8, chunked_prefill_size=256)
    ws = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([20, 31], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, 32, bmm1_scale=128**-0.5, bmm2_scale=1.0)
    assert out.shape == q.shape
