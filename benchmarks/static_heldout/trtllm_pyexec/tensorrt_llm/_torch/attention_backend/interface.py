from dataclasses import dataclass, field
from typing import List, Optional

import torch


@dataclass(kw_only=True)
class AttentionMetadata:
    max_num_requests: int
    max_num_tokens: int
    is_cuda_graph: bool = False
    seq_lens: Optional[torch.Tensor] = None
    seq_lens_kv: Optional[torch.Tensor] = None
    num_contexts: int = 0
    request_ids: List[int] = field(default_factory=list)
    prompt_lens: List[int] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_generations(self) -> int:
        return self.num_seqs - self.num_contexts

    def set_batch(self, seq_lens: List[int], kv_lens: List[int], num_contexts: int):
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
        self.seq_lens_kv = torch.tensor(kv_lens, dtype=torch.int32)
        self.num_contexts = num_contexts
