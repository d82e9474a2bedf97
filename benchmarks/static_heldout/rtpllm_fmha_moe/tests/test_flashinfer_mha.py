import torch

from rtp_llm.models_py.modules.fmha.attn_inputs import build_attn_inputs
from rtp_llm.models_py.modules.fmha.flashinfer_mha import PyFlashinferPrefillAttnOp


def make_workspace():
    return torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106


def test_prefill_prepare(config):
    op = PyFlashinferPrefillAttnOp(config, "cuda")
    inputs = build_attn_inputs([3, 5], [3, 5], [0, 0], [[0], [1]], "cuda")
    max_q_len, _, seq_lens = op.prepare(inputs)
    assert max_q_len == 5  # ok: FC109
    assert seq_lens == [3, 5]
