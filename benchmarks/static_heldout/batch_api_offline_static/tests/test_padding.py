import torch

from bapi.padding import bucket_for, last_page_lens, pad_batch


def test_pad_batch_right_pads_to_the_bucket():
    ids, lens = pad_batch([[1, 2, 3], [4, 5, 6, 7, 8]], bucket_for(5, [4, 8, 16]))
    assert ids.shape == (2, 8)  # ok: FC109
    assert lens.tolist() == [3, 5]


def test_last_page_lens():
    pages, last = last_page_lens(torch.tensor([1, 16, 17], dtype=torch.int32), 16)
    assert pages.tolist() == [1, 1, 2]
    assert last.tolist() == [1, 16, 1]
