import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from spec_tree.tree import TreeSpec


def make_reference_wrapper(device="cuda"):
    workspace = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device=device)  # ok: FC106
    return BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")


def check_accept(out, expected):
    assert out.accept_lens_cpu == expected  # ok: FC109


def test_tree_mask_is_causal_along_paths():
    tree = TreeSpec.from_choices([(0,), (0, 0), (1,)])
    mask = tree.tree_mask
    assert bool(mask.diagonal().all())
