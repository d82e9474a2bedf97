import numpy as np
import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from mserve.metrics import Histogram, MetricsRegistry


def test_histogram_cumulative_render():
    h = Histogram("mserve_seq_len", "", [16, 64, 256])
    h.observe_many(np.array([3, 20, 20, 300]))
    lines = h.render()
    assert 'mserve_seq_len_bucket{le="16.0"} 1' in lines
    assert 'mserve_seq_len_bucket{le="+Inf"} 4' in lines


def test_registry_reuses_metrics():
    reg = MetricsRegistry()
    assert reg.counter("steps_total") is reg.counter("steps_total")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trtllm_gen_wrapper_accepts_zeroed_workspace():
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "HND", backend="trtllm-gen")
    assert not w.is_cuda_graph_enabled
