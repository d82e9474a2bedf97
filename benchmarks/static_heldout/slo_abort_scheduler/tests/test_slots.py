import numpy as np
import torch

from sloserve.config import EngineConfig
from sloserve.slots import SlotTable


def _table():
    cfg = EngineConfig(max_slots=8, max_pages_per_slot=16)
    return SlotTable(cfg, num_pages=64, device=torch.device("cpu"))


def test_compaction_moves_live_rows_down():
    t = _table()
    a, b, c = t.admit(1, 20), t.admit(2, 40), t.admit(3, 5)
    t.release(b)
    moves = t.compact()
    assert moves == [(c, b)]
    assert t.num_rows == 2 and t.slot_of == {1: a, 3: b}


def test_holes_read_the_null_page():
    t = _table()
    t.admit(1, 33)
    t.admit(2, 3)
    t.release(0)
    indptr, indices, last = t.decode_layout(np.arange(2, dtype=np.int32))
    assert indices[0] == 0 and last[0] == 1


def test_workspace_fits_a_full_bucket():
    workspace = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8)  # ok: FC106
    assert workspace.numel() >= 8 * 32 * 129 * 4 * 8
