"""CPU checks of the selection helpers."""

import torch

from nsa import pages_from_blocks, select_topk_blocks


def check_pages(table: torch.Tensor, topk_idx: torch.Tensor, expected: list) -> None:
    got = pages_from_blocks(table, topk_idx).tolist()  # ok: FC101
    assert got == expected, f"{got} != {expected}"  # ok: FC109


def test_pages_from_blocks_flattens_rows():
    table = torch.arange(12, dtype=torch.int64).view(2, 6)
    check_pages(table, torch.tensor([[1, 0], [5, -1]]), [1, 0, 11])


def test_topk_marks_short_rows():
    idx = select_topk_blocks(torch.tensor([[0.1, 0.9, 0.5], [0.3, float("-inf"), float("-inf")]]), 2)
    check_pages(torch.arange(6, dtype=torch.int64).view(2, 3), idx, [1, 2, 3])
