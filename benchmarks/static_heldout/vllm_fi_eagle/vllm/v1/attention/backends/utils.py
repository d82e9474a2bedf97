from dataclasses import dataclass

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


def split_decodes_and_prefills(common_attn_metadata: CommonAttentionMetadata, decode_threshold: int = 1):
    query_lens = common_attn_metadata.query_start_loc_cpu[1:] - common_attn_metadata.query_start_loc_cpu[:-1]
    is_prefill = query_lens > decode_threshold
    if not torch.any(is_prefill):  # ok: FC101
        return common_attn_metadata.num_reqs, 0
    first_prefill = int(is_prefill.int().argmax())  # ok: FC101
    return first_prefill, common_attn_metadata.num_reqs - first_prefill
