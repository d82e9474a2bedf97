"""Page-count helpers."""


def pages_per_seq(lens, page_size):
    assert page_size > 0  # expect: FC109
    return (lens + page_size - 1) // page_size


def last_page_lens(lens, page_size):
    return lens - (pages_per_seq(lens, page_size) - 1) * page_size


def total_pages(lens, page_size):
    """Pages a batch occupies; callers hand it host lengths (pinned mirror, numpy trace)."""
    return int(pages_per_seq(lens, page_size).sum())  # ok: FC101


def max_pages(lens, page_size):
    return int(pages_per_seq(lens, page_size).max())  # expect: FC101
