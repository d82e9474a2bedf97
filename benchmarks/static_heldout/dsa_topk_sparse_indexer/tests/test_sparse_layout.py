import numpy as np

from dsa.config import DSAConfig
from dsa.sparse_pages import SparseIndexBuilder


def test_layout_caps_every_request_at_topk():
    cfg = DSAConfig(index_topk=128, max_batch_size=4)
    builder = SparseIndexBuilder(cfg, device="cpu")
    lay = builder.layout(np.array([5, 300, 128], dtype=np.int32))
    assert lay.counts_np.tolist() == [5, 128, 128]  # ok: FC109
    assert lay.total == 261
    assert lay.kv_indptr_np.tolist() == [0, 5, 133, 261]


def test_gather_pairs_match_the_csr():
    cfg = DSAConfig(index_topk=64, max_batch_size=2)
    builder = SparseIndexBuilder(cfg, device="cpu")
    lay = builder.layout(np.array([3, 70], dtype=np.int32))
    assert lay.rows_np[:4].tolist() == [0, 0, 0, 1]
    assert lay.cols_np[:4].tolist() == [0, 1, 2, 0]
