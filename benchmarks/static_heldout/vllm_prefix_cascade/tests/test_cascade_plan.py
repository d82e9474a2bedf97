"""GPU checks of the cascade split against a single-level reference (run on a GPU box)."""

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper

TEST_WORKSPACE_BYTES = 64 * 1024 * 1024


def make_wrappers():
    ws = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    return MultiLevelCascadeAttentionWrapper(2, ws, "NHD"), BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")


def check_indptr(indptr: torch.Tensor, num_rows: int) -> None:
    assert indptr.numel() == num_rows + 1 and int(indptr[0]) == 0, "malformed indptr"  # ok: FC109


def test_shared_prefix_split_matches_flat():
    cascade, flat = make_wrappers()
    qo = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    check_indptr(qo, 4)
    shared = torch.tensor([0, 4], dtype=torch.int32)
    unique = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    last = torch.full((4,), 16, dtype=torch.int32)
    cascade.plan([torch.tensor([0, 4], dtype=torch.int32), qo], [shared, unique], [torch.arange(4, dtype=torch.int32), torch.arange(4, 8, dtype=torch.int32)],
                 [torch.tensor([16], dtype=torch.int32), last], 8, 8, 128, 16)
    flat.plan(qo, torch.tensor([0, 5, 10, 15, 20], dtype=torch.int32), torch.arange(20, dtype=torch.int32), last, 8, 8, 128, 16)
