from dataclasses import dataclass

import torch


@dataclass
class PyAttentionInputs:
    is_prefill: bool
    input_lengths: torch.Tensor
    sequence_lengths: torch.Tensor
    prefix_lengths: torch.Tensor
    cu_seqlens: torch.Tensor
    position_ids: torch.Tensor
    kv_cache_block_id_host: torch.Tensor
    kv_cache_block_id_device: torch.Tensor


def build_attn_inputs(input_lengths, sequence_lengths, prefix_lengths, block_ids, device):
    input_lengths = torch.tensor(input_lengths, dtype=torch.int32)
    cu = torch.zeros(len(input_lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(input_lengths, 0)
    block_ids_host = torch.tensor(block_ids, dtype=torch.int32)
    return PyAttentionInputs(
        is_prefill=bool(input_lengths.max() > 1),
        input_lengths=input_lengths,
        sequence_lengths=torch.tensor(sequence_lengths, dtype=torch.int32),
        prefix_lengths=torch.tensor(prefix_lengths, dtype=torch.int32),
        cu_seqlens=cu.to(device, non_blocking=True),
        position_ids=torch.cat([torch.arange(n) for n in input_lengths.tolist()]).to(device),
        kv_cache_block_id_host=block_ids_host,
        kv_cache_block_id_device=block_ids_host.to(device, non_blocking=True),
    )
