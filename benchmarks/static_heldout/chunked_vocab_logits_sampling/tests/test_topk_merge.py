import torch

from vocabchunk.ops.topk_merge import merge_chunk_topk


def make_candidates(rows: int, chunks: int, k: int):
    assert rows > 0 and chunks > 0 and k > 0  # ok: FC109
    vals = torch.arange(rows * chunks * k, dtype=torch.float32).view(rows, chunks * k)
    ids = torch.arange(rows * chunks * k).view(rows, chunks * k)
    return vals, ids


def test_merge_masks_rows_with_smaller_k():
    vals, ids = make_candidates(2, 3, 4)
    top, _ = merge_chunk_topk(vals, ids, torch.tensor([4, 2]), 4)
    assert torch.isinf(top[1, 2:]).all()
    assert not torch.isinf(top[0]).any()
