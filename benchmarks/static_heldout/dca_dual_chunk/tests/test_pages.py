import numpy as np
import torch

from dcaserve.pages import DCAPageTable


def _table(chunk_size=64, page_size=16):
    return DCAPageTable(num_pages=64, max_reqs=4, page_size=page_size, chunk_size=chunk_size, device=torch.device("cpu"))


def test_split_for_decode_three_streams():
    table = _table()
    table.admit(7)
    table.grow(7, 200)
    split = table.split_for_decode([7], np.array([200], dtype=np.int32))
    # 200 tokens, chunk 64: chunk 3 holds tokens 192..199 (one page), chunk 2 is succ, chunks 0-1 are inter
    assert split["intra"].nnz == 1  # ok: FC109
    assert split["succ"].nnz == 4
    assert split["inter"].nnz == 8
    assert int(split["intra"].last_page_len[0]) == 8


def test_padded_rows_point_at_page_zero():
    table = _table()
    split = table.split_for_decode([-1, -1], np.ones(2, dtype=np.int32))
    assert split["intra"].indices.tolist() == [0, 0]
