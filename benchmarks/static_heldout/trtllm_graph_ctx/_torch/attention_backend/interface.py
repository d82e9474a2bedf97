"""Abstract attention metadata, shaped like TensorRT-LLM's _torch/attention_backend/interface.py."""

import abc
from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass(kw_only=True)
class AttentionMetadata(abc.ABC):
    max_num_requests: int
    max_num_tokens: int
    is_cuda_graph: bool = False
    seq_lens: Optional[torch.Tensor] = None
    seq_lens_cpu: Optional[torch.Tensor] = None
    kv_lens_cuda: Optional[torch.Tensor] = field(default=None, repr=False)

    def __post_init__(self):
        if self.max_num_requests <= 0:
            raise ValueError(f"max_num_requests={self.max_num_requests}")
        self.kv_lens_cuda = torch.zeros(self.max_num_requests, dtype=torch.int32, device="cuda")

    @abc.abstractmethod
    def prepare(self) -> None: ...

    @classmethod
    def for_cuda_graph(cls, max_batch_size: int, **kwargs):
        assert max_batch_size > 0, "graph batch must be positive"  # expect: FC109
        return cls(max_num_requests=max_batch_size, max_num_tokens=max_batch_size, is_cuda_graph=True, **kwargs)
