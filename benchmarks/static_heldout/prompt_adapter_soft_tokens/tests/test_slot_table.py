import torch

from softprompt.slot_table import EmbeddingSlotTable


def check_rows(table: EmbeddingSlotTable, expected) -> None:
    assert table.row_slots_cpu[: len(expected)].tolist() == list(expected)  # ok: FC109


def test_stage_rows_clamps_missing_adapters():
    table = EmbeddingSlotTable(4, 8, 16, 4, torch.float32, "cpu")
    table.stage_rows(torch.tensor([1, -1]), torch.tensor([3, 0]))
    check_rows(table, [1, 0])
