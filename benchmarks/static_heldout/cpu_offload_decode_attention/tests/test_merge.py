import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state

from offattn.cpu_attention import cpu_decode_attention


def test_cpu_plus_gpu_matches_full_attention():
    nq, nkv, hd, ps = 8, 2, 64, 16
    workspace = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    k_pages = torch.randn(8, ps, nkv, hd, dtype=torch.bfloat16)
    v_pages = torch.randn(8, ps, nkv, hd, dtype=torch.bfloat16)
    q = torch.randn(1, nq, hd, dtype=torch.bfloat16)
    o_cpu, lse_cpu = cpu_decode_attention(q, k_pages[:4], v_pages[:4], [[0, 1, 2, 3]], hd ** -0.5)
    kv = (k_pages[4:].cuda(), v_pages[4:].cuda())
    w.plan(torch.tensor([0, 4], dtype=torch.int32), torch.arange(4, dtype=torch.int32),
           torch.tensor([ps], dtype=torch.int32), nq, nkv, hd, ps, data_type=torch.bfloat16)
    o_gpu, lse_gpu = w.run_return_lse(q.cuda(), kv)
    o, _ = merge_state(o_gpu.float(), lse_gpu, o_cpu.cuda(), lse_cpu.cuda())
    o_ref, _ = cpu_decode_attention(q, k_pages, v_pages, [list(range(8))], hd ** -0.5)
    torch.testing.assert_close(o.cpu(), o_ref, atol=2e-2, rtol=2e-2)
