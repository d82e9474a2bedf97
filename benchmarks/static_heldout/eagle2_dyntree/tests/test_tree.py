import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from eagle2.tree import build_dynamic_tree, pack_tree_mask

WORKSPACE_BYTES = 32 * 1024 * 1024


def test_parents_precede_children():
    scores = torch.tensor([[-0.1, -0.5, -0.2, -0.9, -0.3, -1.2]])
    tokens = torch.arange(6)[None]
    parents = torch.tensor([[-1, -1, 0, 0, 2, 1]])
    tree = build_dynamic_tree(scores, tokens, parents, total_tokens=4, levels=3)
    assert (tree.parents[0] < torch.arange(4)).all()  # ok: FC109
    assert tree.mask[0].diagonal().all()


def test_packed_mask_fits_verify_wrapper():
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    mask = torch.ones(1, 4, 4, dtype=torch.bool, device="cuda").tril()
    packed, indptr = pack_tree_mask(mask, [12])
    assert packed.numel() == indptr[-1] == (4 * 16 + 7) // 8
    w.plan(torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
           torch.zeros(1, dtype=torch.int32, device="cuda"), torch.tensor([16], dtype=torch.int32), 4, 4, 64, 16,
           packed_custom_mask=packed, causal=False)
