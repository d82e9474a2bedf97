import torch

from loraslots.adapters import AdapterSlotTable
from loraslots.config import SlotConfig


def make_cfg(num_slots: int) -> SlotConfig:
    assert num_slots >= 2, "slot 0 is reserved for the zero adapter"  # ok: FC109
    return SlotConfig(num_slots=num_slots, num_layers=2, hidden_size=64, max_rank=8, max_pages=64)


def test_unknown_adapter_has_no_slot():
    table = AdapterSlotTable(make_cfg(4), torch.device("cpu"))
    assert table.slot_of(7) == -1


def test_clear_slot_frees_it():
    table = AdapterSlotTable(make_cfg(4), torch.device("cpu"))
    table.write_slot(2, 7, torch.zeros(2, 2, 64, 4, dtype=torch.float16), 4, 0.5)
    assert table.slot_of(7) == 2
    table.clear_slot(2)
    assert table.slot_of(7) == -1
