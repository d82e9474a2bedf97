"""Host-only checks of the virtual batch split (no GPU needed: every tensor stays on the CPU)."""

import numpy as np
import torch

from l4serve.attention.common import CommonAttentionMetadata, make_local_attention_virtual_batches


def _common(query_lens, seq_lens, width=1024):
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    table = torch.arange(len(seq_lens) * width, dtype=torch.int32).view(len(seq_lens), width)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        block_table_tensor=table,
        block_table_cpu=table,
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64),
        num_reqs=len(seq_lens),
        num_actual_tokens=sum(query_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )


def test_decode_requests_make_one_virtual_batch_each():
    vb = make_local_attention_virtual_batches(8192, _common([1, 1], [9000, 20]), 16)
    assert vb.num_virtual == 2  # ok: FC109
    np.testing.assert_array_equal(vb.seqlens_k_np, [9000 - 8192, 20])


def test_prefill_crossing_a_chunk_boundary_splits():
    vb = make_local_attention_virtual_batches(8192, _common([100], [8242]), 16)
    assert list(np.diff(vb.cu_seqlens_q_np)) == [50, 50]
    assert vb.block_table[1, 0].item() == 8192 // 16
