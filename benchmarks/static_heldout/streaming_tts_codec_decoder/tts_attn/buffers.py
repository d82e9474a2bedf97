from dataclasses import dataclass

import torch


@dataclass
class TextGraphBuffers:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor

    @classmethod
    def allocate(cls, max_streams: int, num_pages: int, device: torch.device) -> "TextGraphBuffers":
        return cls(
            kv_indptr=torch.zeros(max_streams + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(num_pages, dtype=torch.int32, device=device),
            kv_last_page_len=torch.ones(max_streams, dtype=torch.int32, device=device),
            kv_indptr_cpu=torch.zeros(max_streams + 1, dtype=torch.int32, pin_memory=True),
            kv_last_page_len_cpu=torch.ones(max_streams, dtype=torch.int32, pin_memory=True),
        )
