import torch

from ktrans.operators.flashinfer_mla import MLAWrapper


def test_host_mirrors_are_pinned():
    mla = MLAWrapper(8, 256, 64, 16, 512, 4096, torch.device("cuda"))
    assert mla.kv_indptr_host.is_pinned() and mla.kv_len_arr_host.is_pinned()  # ok: FC109
