import flashinfer
import pytest
import torch

from text_generation_server.layers.attention.common import Seqlen
from text_generation_server.models.flash_causal_lm import block_tables_to_ragged

TEST_WORKSPACE_BYTES = 16 * 1024 * 1024


def check_offsets(offsets, lengths):
    assert offsets.tolist() == [0] + [sum(lengths[: i + 1]) for i in range(len(lengths))]  # ok: FC109


def test_decode_seqlen():
    seqlen = Seqlen(
        input_lengths=torch.tensor([1, 1], dtype=torch.int32),
        cache_lengths=torch.tensor([4, 7], dtype=torch.int32),
        max_k=8,
    )
    assert seqlen.max_q == 1
    check_offsets(seqlen.cu_seqlen_k, [5, 8])


def test_ragged_table():
    table = torch.tensor([[3, 4, 0], [7, 8, 9]], dtype=torch.int32)
    ragged = block_tables_to_ragged(block_tables=table, input_lengths=[1, 1], cache_lengths=[1, 2])
    assert ragged.tolist() == [3, 4, 7, 8, 9]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashInfer needs a GPU")
def test_small_workspace_fits_a_tiny_decode_plan():
    workspace = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(
        torch.tensor([0, 2, 5], dtype=torch.int32),
        torch.arange(5, dtype=torch.int32, device="cuda"),
        torch.tensor([1, 1], dtype=torch.int32),
        8,
        8,
        128,
        1,
    )
