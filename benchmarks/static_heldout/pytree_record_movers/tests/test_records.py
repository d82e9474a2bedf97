"""Record movers and the trtllm decode path on a small batch."""

import torch
from flashinfer import trtllm_batch_decode_with_kv_cache

from prm_engine.records import ForwardBatch, ForwardMode, PagedIndexRecord
from prm_tree.move import move, to_host

TEST_WS_BYTES = 32 << 20


def _batch(device):
    n = 4
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=n,
        input_ids=torch.arange(n, device=device), positions=torch.arange(n, device=device),
        seq_lens=torch.full((n,), 7, dtype=torch.int32, device=device),
        req_pool_indices=torch.arange(n, device=device), out_cache_loc=torch.arange(n, device=device),
        seq_lens_cpu=torch.full((n,), 7, dtype=torch.int32),
    )


def test_move_roundtrip():
    fb = _batch("cuda")
    host = to_host(fb)
    assert host.seq_lens.tolist() == [7, 7, 7, 7]  # ok: FC101, FC109
    back = move(host, "cuda")
    assert torch.equal(back.seq_lens.cpu(), host.seq_lens)


def test_page_record_pin():
    rec = PagedIndexRecord(kv_indptr=torch.tensor([0, 1, 2]), kv_last_page_len=torch.tensor([3, 4]), num_pages=2)
    assert rec.pin().kv_indptr.is_pinned()


def test_trtllm_decode_smoke():
    q = torch.randn(4, 32, 128, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(8, dtype=torch.int32, device="cuda").view(4, 2)
    lens = torch.full((4,), 20, dtype=torch.int32, device="cuda")
    ws = torch.empty(TEST_WS_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC105  # ok: FC106
    out = trtllm_batch_decode_with_kv_cache(q, cache, ws, tables, lens, 32, bmm1_scale=0.088, bmm2_scale=1.0)
    zeroed = torch.zeros(TEST_WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    ref = trtllm_batch_decode_with_kv_cache(q, cache, zeroed, tables, lens, 32, bmm1_scale=0.088, bmm2_scale=1.0)
    torch.testing.assert_close(out, ref)
