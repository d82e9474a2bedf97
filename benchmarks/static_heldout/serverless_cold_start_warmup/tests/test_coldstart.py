import numpy as np
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from coldstart import HealthChecker


def test_health_ready_after_warm_buckets():
    h = HealthChecker(max_step_ms=50.0, warm_buckets_needed=2)
    h.warm_buckets = 2
    assert h.ready()  # ok: FC109


def test_trtllm_long_context_matches_reference():
    dev = "cuda"
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)  # expect: FC105
    q = torch.randn(2, 16, 128, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(8, 2, 4, 16, 128, dtype=torch.bfloat16, device=dev)
    tables = torch.arange(8, dtype=torch.int32, device=dev).view(2, 4)
    lens = torch.from_numpy(np.array([60, 33], dtype=np.int32)).to(dev)
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 64)
    assert out.shape == q.shape

