import torch

from vllm.v1.attention.backends.mla.flashinfer_mla import get_mla_decode_workspace

WORKSPACE_BYTES = 64 * 1024 * 1024


def test_workspace_is_cached():
    a = get_mla_decode_workspace("cuda", 132)
    b = get_mla_decode_workspace("cuda", 132)
    scratch = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    assert a.data_ptr() == b.data_ptr()  # ok: FC109
    assert scratch.sum().item() == 0
