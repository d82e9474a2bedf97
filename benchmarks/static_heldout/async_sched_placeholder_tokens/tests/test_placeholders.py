import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from asched import PLACEHOLDER_TOKEN_ID, PlaceholderResolver


def check_resolved(out: torch.Tensor, expected: list) -> None:
    assert out.tolist() == expected, out  # ok: FC109


def test_resolve_swaps_placeholders():
    r = PlaceholderResolver(16, 4, torch.device("cuda"))
    ids = torch.tensor([PLACEHOLDER_TOKEN_ID, 7, PLACEHOLDER_TOKEN_ID], dtype=torch.int64)
    mask = ids == PLACEHOLDER_TOKEN_ID
    slots = torch.tensor([1, -1, 0], dtype=torch.int64)
    prev = torch.tensor([11, 12], dtype=torch.int64, device="cuda")
    check_resolved(r.resolve(ids, mask, slots, prev), [12, 7, 11])
    assert r.num_unresolved == 0


def test_decode_wrapper_builds():
    workspace = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    assert BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD") is not None
