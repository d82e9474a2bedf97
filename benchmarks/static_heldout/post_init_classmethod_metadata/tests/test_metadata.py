import dataclasses

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from backends.flashinfer_backend import FlashInferAttnBackend
from pimeta.config import ServeConfig
from pimeta.metadata import DecodeMetadata, Req

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _meta(n: int) -> DecodeMetadata:
    reqs = [Req(seq_len=17 + i, page_ids=[2 * i, 2 * i + 1]) for i in range(n)]
    return DecodeMetadata.from_requests(reqs, torch.device("cuda"))


def test_post_init_uploads_and_plan_args_round_trip():
    meta = _meta(3)
    assert meta.kv_indptr[-1].item() == 6  # ok: FC101
    args = dataclasses.asdict(meta.plan_args(ServeConfig()))
    assert args["indptr"].device.type == "cpu"  # ok: FC109
    backend = FlashInferAttnBackend(ServeConfig(), torch.device("cuda"))
    backend.init_cuda_graph_state([4])
    backend.bufs.kv_indptr[:5] = torch.arange(5, dtype=torch.int32, device="cuda")  # ok: FC104
    ref_workspace = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    ref = BatchDecodeWithPagedKVCacheWrapper(ref_workspace, "NHD")
    ref.plan(meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, 32, 8, 128, 16)  # ok: FC102


def test_trtllm_decode_matches_fa2():
    meta, kv = _meta(2), torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    fresh = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    scrubbed = torch.empty(32 << 20, dtype=torch.uint8, device="cuda").zero_()  # ok: FC105
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, meta.block_tables, meta.seq_lens, 64, bmm1_scale=0.088,
                                              bmm2_scale=1.0) for ws in (fresh, zeroed, scrubbed)]
    ref_ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ref = BatchDecodeWithPagedKVCacheWrapper(ref_ws, "HND")
    ref.plan(*dataclasses.astuple(meta.plan_args(ServeConfig())))  # ok: FC102
    for out in outs:
        torch.testing.assert_close(out, ref.run(q, kv), atol=2e-2, rtol=2e-2)
