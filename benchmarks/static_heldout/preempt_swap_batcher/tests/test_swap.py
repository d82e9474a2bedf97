"""Swap round trip and block accounting; needs one GPU."""
import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from swapbatch.scheduler import BlockSpaceManager, Sequence
from swapbatch.worker import CacheEngine

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@cuda
def test_swap_out_then_in_restores_block():
    engine = CacheEngine(2, 8, 8, 16, 2, 64, torch.float16, "NHD", "cuda")
    engine.gpu_cache[0][3].normal_()
    expected = engine.gpu_cache[0][3].float().sum().item()
    engine.swap_out([(3, 5)])
    engine.gpu_cache[0][3].zero_()
    engine.swap_in([(5, 6)])
    total = engine.gpu_cache[0][6].float().sum().item()  # ok: FC101
    assert abs(total - expected) < 1e-3  # ok: FC109


def test_block_accounting():
    mgr = BlockSpaceManager(block_size=16, num_gpu_blocks=4, num_cpu_blocks=4)
    seq = Sequence(0, list(range(40)))
    mgr.allocate(seq)
    pairs = mgr.swap_out(0)
    assert len(pairs) == 3
    assert len(mgr.swap_in(0)) == 3


@cuda
def test_decode_wrapper_accepts_swapped_tables():
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    indices = torch.tensor([6, 1], dtype=torch.int32)
    last = torch.tensor([7], dtype=torch.int32)
    w.plan(indptr, indices, last, 4, 2, 64, 16)
