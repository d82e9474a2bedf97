"""Page tables and the trtllm-gen overflow decode (needs a GPU)."""
import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from ppengine import PAGE_SIZE, PipelineConfig, build_page_table, build_page_table_host

SEQ_LENS, PAGES = [17, 1, 32], [[3, 4], [9], [5, 6]]


def _fresh_workspace(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # expect: FC105


def test_device_page_table_matches_host():
    indptr_h, indices_h, last_h = build_page_table_host(SEQ_LENS, PAGES)
    req_to_page = torch.tensor([[3, 4], [9, 0], [5, 6]], dtype=torch.int32, device="cuda")
    indptr, indices, last = build_page_table(torch.tensor(SEQ_LENS, device="cuda"), req_to_page, torch.arange(3, device="cuda"))
    total = indptr[-1].item()  # ok: FC101
    assert total == indptr_h[-1]  # ok: FC109
    assert np.array_equal(indices.cpu().numpy(), indices_h) and np.array_equal(last.cpu().numpy(), last_h)


def test_overflow_decode_matches_fa2():
    nbytes = PipelineConfig(num_qo_heads=8, num_kv_heads=2, head_dim=64).planner_workspace_bytes()
    q, kv = (torch.randn(*shape, dtype=torch.bfloat16, device="cuda") for shape in ((3, 8, 64), (16, 2, PAGE_SIZE, 2, 64)))
    tables = torch.tensor([[3, 4], [9, 0], [5, 6]], dtype=torch.int32, device="cuda")
    lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device="cuda")
    zeroed = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    scrubbed = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    scrubbed.zero_()
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 32) for ws in (zeroed, scrubbed, _fresh_workspace(nbytes))]
    ref = BatchDecodeWithPagedKVCacheWrapper(torch.empty(nbytes, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC105
    indptr, last = torch.tensor([0, 2, 3, 5], dtype=torch.int32, device="cuda"), torch.tensor([1, 1, 16], dtype=torch.int32)
    ref.plan(indptr, tables.flatten()[[0, 1, 2, 4, 5]], last, 8, 2, 64, PAGE_SIZE)  # ok: FC102
    for out in outs:
        torch.testing.assert_close(out, ref.run(q, kv), rtol=2e-2, atol=2e-2)


def test_decode_plan_on_a_fixed_workspace():
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC106
    w.plan(*(torch.tensor(x, dtype=torch.int32) for x in ([0, 1], [7], [4])), 8, 2, 64, PAGE_SIZE)
