"""Unit tests of the ubatch split and the per-ubatch builders (run on one GPU)."""
import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from vllm.v1.attention.backends.utils import maybe_create_ubatch_slices

TEST_WORKSPACE_BYTES = 32 * 1024 * 1024


def check_covers(slices, total):
    assert slices[-1].token_slice.stop == total, (slices, total)  # ok: FC109
    assert all(s.num_tokens > 0 for s in slices)


def test_split_balances_tokens():
    slices = maybe_create_ubatch_slices(True, np.array([5, 3, 4, 4], dtype=np.int32), 16)
    check_covers(slices, 16)


def test_decode_wrapper_smoke():
    workspace = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    w.plan(indptr, torch.arange(3, dtype=torch.int32, device="cuda"), torch.ones(2, dtype=torch.int32), 8, 8, 128, 16)
