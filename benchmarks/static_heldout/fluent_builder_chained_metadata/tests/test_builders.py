"""Builder chains against a real FlashInfer install (needs a GPU)."""
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from fluentmeta import DecodeMetadataBuilder, EngineConfig

CFG = EngineConfig(max_batch_size=4, max_running_requests=8, num_pages=64, num_layers=1)
DEV = torch.device("cuda")


def test_chain_pads_to_bucket_and_matches_device_plan():
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=DEV)  # ok: FC106
    i32 = dict(dtype=torch.int32, device=DEV)
    bufs = (torch.zeros(5, **i32), torch.zeros(64, **i32), torch.ones(4, **i32))
    req_to_page = torch.arange(64, **i32).view(8, 8)
    builder = DecodeMetadataBuilder(CFG, req_to_page, BatchDecodeWithPagedKVCacheWrapper(ws), *bufs)
    lens = torch.tensor([5, 17, 1], dtype=torch.int32)
    builder = builder.with_seq_lens(lens.to(DEV), lens).with_requests(torch.arange(3, device=DEV))
    meta = builder.with_pages().for_bucket(4).build()
    assert meta.batch_size == 4  # ok: FC109
    assert meta.kv_indptr[3].item() == 1 + 2 + 1  # ok: FC101
    assert meta.wrapper._plan_info is not None  # ok: FC103
    ref = BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=DEV))  # ok: FC105
    ref.plan(meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, 32, 8, 128, 16)  # ok: FC102


def test_trtllm_decode_ignores_workspace_history():
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device=DEV)
    kv = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device=DEV)
    tables = torch.arange(8, dtype=torch.int32, device=DEV).view(2, 4)
    lens = torch.tensor([40, 64], dtype=torch.int32, device=DEV)
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)  # expect: FC105
    zeroed = torch.zeros(64 << 20, dtype=torch.uint8, device=DEV)  # ok: FC105
    recycled = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)  # ok: FC105
    recycled.zero_()
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, w, tables, lens, max_seq_len=64) for w in (fresh, zeroed, recycled)]
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[1], outs[2])
