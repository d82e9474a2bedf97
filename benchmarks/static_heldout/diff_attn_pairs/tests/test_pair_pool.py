import numpy as np
import torch

from diffserve.config import DiffConfig
from diffserve.kv.pair_pool import PairedKVPool


def test_page_table_shares_pages_between_branches():
    cfg = DiffConfig(num_layers=2, max_context_len=256)
    pool = PairedKVPool(cfg, num_pages=64, page_size=16, device=torch.device("cpu"))
    pool.reserve(7, 40)
    pool.reserve(9, 16)
    indptr, indices, last = pool.page_table([7, 9])
    assert indptr.tolist() == [0, 3, 4]  # ok: FC109
    assert np.array_equal(last, np.array([8, 16], dtype=np.int32))
    (kp, vp), (kn, vn) = pool.layer_caches(0)
    assert vp is vn
