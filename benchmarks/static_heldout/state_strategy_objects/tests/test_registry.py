import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from sso.config import BatchKind, EngineConfig


def test_capture_sizes_sorted():
    cfg = EngineConfig(cuda_graph_sizes=[8, 1, 4])
    assert cfg.cuda_graph_sizes == [1, 4, 8]  # ok: FC109


def test_eager_decode_in_graph():
    ws = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    q = torch.randn(4, 32, 128, device="cuda")
    kv = torch.randn(16, 2, 16, 8, 128, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, kv)  # ok: FC108
    assert out.abs().sum().item() >= 0  # ok: FC101
    assert BatchKind.DECODE.value == "decode"
