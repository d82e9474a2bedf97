import numpy as np
import torch
import flashinfer

from g3engine import LOCAL_PAGE_SIZE, window_page_counts

TEST_WORKSPACE_BYTES = 32 * 1024 * 1024


def test_window_page_counts_slide():
    lens = np.array([10, 1024, 1500, 4096], dtype=np.int32)
    counts, first = window_page_counts(lens, 1024, LOCAL_PAGE_SIZE)
    assert first[0] == 0 and first[1] == 0  # ok: FC109
    assert counts[3] == (4096 - first[3] * LOCAL_PAGE_SIZE + LOCAL_PAGE_SIZE - 1) // LOCAL_PAGE_SIZE


def test_local_prefill_matches_reference():
    ws = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    kv = torch.randn(8, 2, LOCAL_PAGE_SIZE, 1, 64, dtype=torch.float16, device="cuda")
    q = torch.randn(20, 1, 64, dtype=torch.float16, device="cuda")
    qo_indptr = torch.tensor([0, 20], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 2], dtype=torch.int32)
    kv_indices = torch.tensor([3, 5], dtype=torch.int32)
    last = torch.tensor([4], dtype=torch.int32)
    w.plan(qo_indptr, kv_indptr, kv_indices, last, 1, 1, 64, LOCAL_PAGE_SIZE, causal=True, window_left=15)
    out = w.run(q, kv)
    lens = (out.abs().sum(-1) > 0).sum(0).tolist()  # ok: FC101
    assert lens == [20]
