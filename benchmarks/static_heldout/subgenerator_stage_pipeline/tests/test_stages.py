import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from genserve import Engine, EngineConfig
from genserve.batch import PageGrant, Request, StageEvent

SMALL = EngineConfig(num_layers=2, num_pages=256, max_batch_size=8, decode_buckets=(1, 2, 4, 8))


@pytest.fixture
def engine() -> Engine:
    eng = Engine(SMALL)
    eng.warmup()
    return eng


def test_bucket_rounding(engine):
    assert engine.cfg.bucket_for(3) == 4  # ok: FC109


def test_schedule_asks_for_pages(engine):
    engine.submit(Request(rid=0, prompt_ids=[1, 2, 3], max_new_tokens=2))
    gen = engine.pipeline.scheduler.schedule(engine.active)
    event = next(gen)
    assert event == StageEvent("alloc", 1)
    ids = torch.tensor([7], dtype=torch.int32)
    with pytest.raises(StopIteration) as stop:
        gen.send(PageGrant(page_ids_cpu=ids, page_ids=ids.cuda()))
    assert stop.value.value.seq_lens.max().item() == 3  # ok: FC101


def test_trtllm_decode_plans_with_device_indptr():
    ws = torch.zeros(16 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "HND", backend="trtllm-gen")
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    indices = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    last = torch.ones(2, dtype=torch.int32, device="cuda")
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.bfloat16)  # ok: FC102


def test_fresh_trtllm_workspace():
    workspace = torch.empty(SMALL.trtllm_workspace_bytes(), dtype=torch.uint8, device="cuda")  # expect: FC105
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "HND", backend="trtllm-gen")
    assert w.is_cuda_graph_enabled is False
