"""Step-record round trips and a bucket plan, on one GPU."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from tupserve.records import host_view, make_meta, pad_host_pairs, replace_slot
from tupserve.slots import (
    BATCH_SIZE,
    DEV,
    HOST,
    KV_INDICES,
    KV_INDPTR,
    KV_LAST_PAGE_LEN,
    MODE,
    SEQ_LENS,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _rows(page_size: int) -> list[tuple]:
    # (rid, seq_len, extend_len, page_ids, tokens)
    return [
        (0, page_size + 3, 1, [7, 2], [11]),
        (1, 1, 1, [5], [12]),
        (2, 3 * page_size, 1, [1, 9, 4], [13]),
    ]


@pytest.mark.parametrize("page_size", [1, 16])
def test_make_meta_pairs(page_size):
    meta = make_meta(_rows(page_size), page_size, torch.device("cuda"))
    assert meta[BATCH_SIZE] == 3 and meta[MODE] == "decode"
    kv_d, kv_h = meta[KV_INDPTR]
    assert kv_h.is_pinned() and kv_d.is_cuda
    assert kv_d[-1].item() == 6  # ok: FC101
    assert meta[KV_LAST_PAGE_LEN][HOST].max() <= page_size  # ok: FC109
    assert torch.equal(meta[SEQ_LENS][DEV].cpu(), meta[SEQ_LENS][HOST])


def test_host_view_and_replace_slot():
    meta = make_meta(_rows(16), 16, torch.device("cuda"))
    hv = host_view(meta)
    assert len(hv) == len(meta)
    assert all(not t.is_cuda for t in hv[:2])
    swapped = replace_slot(meta, MODE, "extend")
    assert swapped[:MODE] == meta[:MODE] and swapped[MODE] == "extend"


def test_pad_host_pairs_pads_empty_rows():
    meta = pad_host_pairs(make_meta(_rows(16), 16, torch.device("cuda")), 8)
    kv_h = meta[KV_INDPTR][HOST]
    assert kv_h.numel() == 9 and int(kv_h[-1]) == 6
    assert meta[KV_LAST_PAGE_LEN][HOST][3:].sum() == 0


def test_bucket_plan_then_patch():
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
    indptr = torch.zeros(4, dtype=torch.int32, device="cuda")
    indices = torch.zeros(16, dtype=torch.int32, device="cuda")
    last = torch.ones(3, dtype=torch.int32, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "HND",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last,
    )
    meta = make_meta(_rows(16), 16, torch.device("cuda"))
    hv = host_view(meta)
    w.plan(*hv[KV_INDPTR : KV_LAST_PAGE_LEN + 1], 32, 8, 128, 16)
    # the test pokes the bound buffer after the plan to check the wrapper reads it by address
    last.fill_(16)  # ok: FC104
    assert torch.equal(w._paged_kv_last_page_len_buf, last)  # ok: FC103


def test_trtllm_decode_smoke():
    if torch.cuda.get_device_capability()[0] < 10:
        pytest.skip("trtllm-gen needs sm100")
    meta = make_meta(_rows(16), 16, torch.device("cuda"))
    ws = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    kv = torch.randn(16, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(3, 32, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.tensor([[7, 2, 0], [5, 0, 0], [1, 9, 4]], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        q, kv, ws, block_tables, meta[SEQ_LENS][DEV], 48, bmm1_scale=128**-0.5, bmm2_scale=1.0
    )
    assert out.shape == q.shape
    assert meta[KV_INDICES].numel() == 6
