import numpy as np
import torch

from sdt import batch_tree_mask, build_tree, tree_position_ids
from sdt_attn.masks import pack_tree_mask


def test_ancestor_mask_and_positions():
    tree = build_tree([-1, 0, 0, 1])
    assert tree.mask_np[3].tolist() == [True, True, False, True]  # ok: FC109
    pos = tree_position_ids(tree, np.array([5, 9]))
    assert pos.tolist() == [5, 6, 6, 7, 9, 10, 10, 11]


def test_packed_mask_round_trip():
    tree = build_tree([-1, 0, 1])
    lens = np.array([2, 3])
    mask = torch.from_numpy(batch_tree_mask(tree, lens)).cuda()
    seg = torch.tensor([3 * (2 + 3), 3 * (3 + 3)], dtype=torch.int32, device="cuda")
    packed, packed_indptr = pack_tree_mask(mask, seg)
    first_bytes = packed[:2].tolist()  # ok: FC101
    if first_bytes[0] & 1 != 1:
        raise AssertionError(f"root must see the first prefix token: {first_bytes}")
