import threading

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from stlserve.batch import ForwardBatch, ForwardMode, Request
from stlserve.config import EngineConfig
from stlserve.thread_state import ThreadState
from stlserve.workspace import SingletonMeta, WorkspaceManager

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture(autouse=True)
def fresh_singletons():
    EngineConfig.reset()
    EngineConfig.install(EngineConfig(max_batch_size=8, num_layers=2, num_pages=256, max_seq_len=2048))
    SingletonMeta.drop(WorkspaceManager)
    yield
    ThreadState.clear()
    SingletonMeta.drop(WorkspaceManager)
    EngineConfig.reset()


def test_config_is_process_wide():
    seen = []
    t = threading.Thread(target=lambda: seen.append(EngineConfig.get_instance()))
    t.start()
    t.join()
    assert seen[0] is EngineConfig.get_instance()  # ok: FC109


def test_workspace_manager_is_a_singleton():
    first = WorkspaceManager(EngineConfig.get_instance())
    assert WorkspaceManager() is first
    with pytest.raises(AssertionError):
        WorkspaceManager(EngineConfig())


@requires_cuda
def test_thread_state_is_per_thread():
    ThreadState.bind_device(torch.device("cuda:0"))
    mine = ThreadState.wrappers()
    other = []

    def worker() -> None:
        ThreadState.bind_device(torch.device("cuda:0"))
        other.append(ThreadState.wrappers())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert other[0] is not mine
    assert other[0].decode is not mine.decode


@requires_cuda
def test_batch_upload_matches_host_mirror():
    device = torch.device("cuda:0")
    ThreadState.bind_device(device)
    reqs = [Request(rid=i, prompt_ids=[1] * (5 + i), page_ids=[i]) for i in range(3)]
    batch = ForwardBatch.from_requests(reqs, ForwardMode.DECODE, device)
    torch.cuda.current_stream().synchronize()
    assert batch.seq_lens.max().item() == int(batch.seq_lens_cpu.max())  # ok: FC101
    assert torch.equal(batch.kv_indptr.cpu(), batch.kv_indptr_cpu)


@requires_cuda
def test_trtllm_decode_wrapper_with_zeroed_workspace():
    cfg = EngineConfig.get_instance()
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105, FC106
    ws.zero_()
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="trtllm-gen")
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32)
    indices = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    last = torch.tensor([3, 7], dtype=torch.int32)
    w.plan(indptr, indices, last, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
           q_data_type=cfg.dtype, kv_data_type=cfg.dtype)
    q = torch.randn(2, cfg.num_q_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    k = torch.randn(4, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    out = w.run(q, (k, k.clone()))
    assert out.shape == q.shape
