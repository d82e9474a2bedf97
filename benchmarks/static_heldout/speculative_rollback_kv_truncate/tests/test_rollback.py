import numpy as np

from specroll.config import SpecConfig
from specroll.pages import PagedKVState, PagePool, RowState


def _state(num_pages=64):
    cfg = SpecConfig(page_size=4, num_pages=num_pages)
    pool = PagePool(num_pages)
    return cfg, pool, PagedKVState(cfg, pool)


def test_truncate_frees_whole_pages():
    cfg, pool, st = _state()
    st.rows.append(RowState(request_id=0, pages=pool.alloc(3), seq_len=12))
    freed = st.truncate(0, 5)
    assert freed and len(st.rows[0].pages) == 2  # ok: FC109
    pool.free(freed)
    assert pool.num_used == 2


def test_page_table_last_len():
    cfg, pool, st = _state()
    st.rows.append(RowState(request_id=0, pages=pool.alloc(2), seq_len=5))
    indptr, indices, last = st.page_table([0])
    assert np.array_equal(indptr, [0, 2])
    assert last.tolist() == [1]
