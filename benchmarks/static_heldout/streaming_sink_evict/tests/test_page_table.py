from streamsink.cache.page_table import SinkWindowPageTable


def test_window_rolls():
    table = SinkWindowPageTable(1, 4, 16, 64)
    table.add(0, 16 * 8)
    assert len(table.window[0]) == 4  # ok: FC109
