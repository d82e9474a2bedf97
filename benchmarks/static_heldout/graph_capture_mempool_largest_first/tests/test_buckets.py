"""Bucket arithmetic (host only)."""

import numpy as np

from gcap.buckets import largest_first, pad_to_bucket, padded_indptr, padded_last_page_len


def test_largest_first_dedups():
    assert largest_first([4, 1, 4, 2]) == [4, 2, 1]


def test_pad_to_bucket_rounds_up():
    buckets = [1, 2, 4, 8, 16]
    assert [pad_to_bucket(b, buckets) for b in (1, 3, 5, 16)] == [1, 4, 8, 16]  # ok: FC109


def test_padded_indptr_one_null_page_per_padding_row():
    ind = padded_indptr(np.array([2, 3], dtype=np.int32), 4)
    assert ind.tolist() == [0, 2, 5, 6, 7]


def test_last_page_len_of_padding_rows_is_one():
    last = padded_last_page_len(np.array([16, 17], dtype=np.int32), 4, 16)
    assert last.tolist() == [16, 1, 1, 1]
