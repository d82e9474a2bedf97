import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from tpdist import TPConfig
from tp_attn.backend import RankAttnBackend


def test_overflow_plan_on_host_tensors():
    cfg = TPConfig(world_size=2, buckets=[1, 2, 4])
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ref = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    ref.plan(indptr, torch.arange(3, dtype=torch.int32, device="cuda"), torch.tensor([5, 9], dtype=torch.int32),
             cfg.heads_per_rank, cfg.kv_heads_per_rank, cfg.head_dim, cfg.page_size)
    assert ref.is_cuda_graph_enabled is False  # ok: FC109


def test_graph_wrappers_share_landing_buffer():
    cfg = TPConfig(world_size=2, buckets=[1, 2, 4])
    backend = RankAttnBackend(cfg, torch.device("cuda"))
    backend.init_graph_wrappers()
    workspace = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    extra = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    assert sorted(backend.decode_wrappers) == [1, 2, 4]
    del extra
