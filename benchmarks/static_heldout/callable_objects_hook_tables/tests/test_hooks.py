import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from attn.trtllm_gen import TrtllmGenDecode
from hookserve.config import ServeConfig

WS_BYTES = 16 << 20


def test_bucket_plan_closure_stages_host_indptr(bs=4):
    path = TrtllmGenDecode(ServeConfig(max_batch_size=8, max_seq_len=512, decode_buckets=(1, 2, 4, 8)), torch.device("cuda"))
    w = path.graph_wrappers[bs]
    w.plan(torch.arange(bs + 1, dtype=torch.int32, device="cuda"), path.indices, path.last_page[:bs], 32, 8, 128, 16)  # ok: FC102
    assert w._plan_info is not None  # ok: FC103
    assert path.indptr[: bs + 1].cpu().tolist() == list(range(bs + 1))  # ok: FC101
    assert bs in path.plan_fns and path.last_page[0].item() == 1  # ok: FC109


def test_trtllm_workspaces_agree():
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(2, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    tables, lens = torch.zeros(1, 1, dtype=torch.int32, device="cuda"), torch.ones(1, dtype=torch.int32, device="cuda")
    fresh = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared.zero_()
    filled = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled.fill_(0)
    ref = trtllm_batch_decode_with_kv_cache(q, kv, zeroed, tables, lens, 16, bmm1_scale=1.0, bmm2_scale=1.0)
    for ws in (fresh, cleared, filled):
        out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 16, bmm1_scale=1.0, bmm2_scale=1.0)
        assert (out - ref).abs().max().item() < 1e-2  # ok: FC101
    fa2 = BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC106
    fa2.plan(torch.tensor([0, 1], dtype=torch.int32), tables[0], torch.ones(1, dtype=torch.int32), 32, 8, 128, 16)
