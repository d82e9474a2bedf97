import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from ice import EngineConfig, host_indptr, host_last_page_len


def test_host_indptr_counts_pages():
    lens = torch.tensor([1, 16, 17, 40], dtype=torch.int32)
    indptr = host_indptr(lens, 16)
    assert indptr.tolist() == [0, 1, 2, 4, 7]  # ok: FC109
    assert host_last_page_len(lens, 16).tolist() == [1, 16, 1, 8]


def test_graph_wrapper_matches_eager():
    cfg = EngineConfig(num_layers=1)
    dev = torch.device("cuda")
    ws = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=dev)  # ok: FC106
    indptr = torch.tensor([0, 2], dtype=torch.int32, device=dev)
    indices = torch.tensor([3, 5], dtype=torch.int32, device=dev)
    last = torch.tensor([7], dtype=torch.int32, device=dev)
    w = BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "HND",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last,
    )
    w.plan(indptr.cpu(), indices, last.cpu(), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
    kv = torch.randn(8, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.float16, device=dev)
    q = torch.randn(1, cfg.num_heads, cfg.head_dim, dtype=torch.float16, device=dev)
    out = w.run(q, kv)
    first = out[0, :4, 0].tolist()  # ok: FC101
    if any(x != x for x in first):
        raise AssertionError(f"NaN in decode output: {first}")
