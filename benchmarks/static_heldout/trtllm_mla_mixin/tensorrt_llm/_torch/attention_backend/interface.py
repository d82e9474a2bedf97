from dataclasses import dataclass, field

import torch


class CudaGraphBufferMixin:
    """Shared by every attention metadata that is replayed from a captured graph."""

    def reset_for_dummy_request(self):
        self.kv_lens_buf.fill_(1)  # expect: FC104
        self.kv_indptr_buf.zero_()  # expect: FC104

    def graph_buffer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv_lens_buf, self.kv_indptr_buf))


@dataclass(kw_only=True)
class AttentionMetadata:
    max_num_requests: int
    max_num_tokens: int
    kv_cache_manager: object
    is_cuda_graph: bool = False
    num_contexts: int = 0
    seq_lens_cpu: torch.Tensor = field(default=None)
