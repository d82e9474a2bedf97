"""Attention metadata shared by all backends, and the split of one batch into two micro-batches (DBO)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, NamedTuple, Optional

import numpy as np
import torch


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor


class UBatchSlice(NamedTuple):
    request_slice: slice
    token_slice: slice

    @property
    def num_tokens(self) -> int:
        return self.token_slice.stop - self.token_slice.start


def _validate_padding(num_scheduled_tokens: np.ndarray, num_tokens_padded: int) -> None:
    assert num_tokens_padded >= int(num_scheduled_tokens.sum()), num_tokens_padded  # expect: FC109


def maybe_create_ubatch_slices(should_ubatch: bool, num_scheduled_tokens: np.ndarray, num_tokens_padded: int) -> Optional[List[UBatchSlice]]:
    """Split the batch at the request boundary closest to half of the tokens."""
    if not should_ubatch or len(num_scheduled_tokens) < 2:
        return None
    cu = np.cumsum(num_scheduled_tokens)
    split_req = int(np.searchsorted(cu, cu[-1] // 2)) + 1
    split_req = min(split_req, len(num_scheduled_tokens) - 1)
    _validate_padding(num_scheduled_tokens, num_tokens_padded)
    split_tok = int(cu[split_req - 1])
    return [
        UBatchSlice(slice(0, split_req), slice(0, split_tok)),
        UBatchSlice(slice(split_req, len(num_scheduled_tokens)), slice(split_tok, num_tokens_padded)),
    ]


def _slice_common_metadata(ub: UBatchSlice, cm: CommonAttentionMetadata) -> CommonAttentionMetadata:
    rs, ts = ub.request_slice, ub.token_slice
    query_start_loc = cm.query_start_loc[rs.start : rs.stop + 1] - cm.query_start_loc[rs.start]
    query_start_loc_cpu = cm.query_start_loc_cpu[rs.start : rs.stop + 1] - cm.query_start_loc_cpu[rs.start]
    seq_lens_cpu = cm.seq_lens_cpu[rs]
    max_seq_len = int(seq_lens_cpu.max())  # ok: FC101
    max_query_len = int(torch.diff(query_start_loc).max())  # expect: FC101
    return dataclasses.replace(
        cm,
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens=cm.seq_lens[rs],
        seq_lens_cpu=seq_lens_cpu,
        num_reqs=rs.stop - rs.start,
        num_actual_tokens=ts.stop - ts.start,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        block_table_tensor=cm.block_table_tensor[rs],
        slot_mapping=cm.slot_mapping[ts],
    )


def split_attn_metadata(ubatch_slices: List[UBatchSlice], cm: CommonAttentionMetadata) -> List[CommonAttentionMetadata]:
    return [_slice_common_metadata(ub, cm) for ub in ubatch_slices]


def split_decodes_and_prefills(cm: CommonAttentionMetadata, decode_threshold: int = 1):
    """Requests are reordered so that decodes come first; count them on the host mirror."""
    query_lens = np.diff(cm.query_start_loc_cpu.numpy())
    is_prefill = query_lens > decode_threshold
    if not is_prefill.any():  # ok: FC101
        return cm.num_reqs, 0, cm.num_actual_tokens, 0
    first_prefill = int(np.argmax(is_prefill))
    num_decode_tokens = int(cm.query_start_loc_cpu[first_prefill])
    return first_prefill, cm.num_reqs - first_prefill, num_decode_tokens, cm.num_actual_tokens - num_decode_tokens
