import torch

from gpumig.limits import MigrationLimits
from gpumig.page_table import NULL_PAGE, DevicePageTable


def make_table(rows: int, width: int) -> DevicePageTable:
    assert rows > 0 and width > 0  # ok: FC109
    return DevicePageTable(MigrationLimits(max_batch=rows, max_pages_per_req=width), torch.device("cpu"))


def test_set_pages_pads_with_null_page():
    table = make_table(2, 4)
    table.add(7, [3, 4, 5], 40)
    table.set_pages(7, [3, 4])
    assert table.table_np[table.rows[7]].tolist() == [3, 4, NULL_PAGE, NULL_PAGE]
