from dataclasses import dataclass
from typing import Tuple


@dataclass
class QAConfig:
    num_layers: int = 40
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 64
    max_batch_size: int = 512
    max_docs: int = 64
    max_doc_tokens: int = 262144
    max_question_tokens: int = 512
    max_answer_tokens: int = 1024
    num_pages: int = 400000
    num_cite_pages: int = 16384
    graph_batch_sizes: Tuple[int, ...] = (1, 4, 16, 64, 128, 256, 512)
    disable_cuda_graph: bool = False
    use_trtllm_prefill: bool = False

    @property
    def max_doc_pages(self) -> int:
        return self.max_docs * (self.max_doc_tokens // self.page_size)

    @property
    def max_unique_pages(self) -> int:
        per_req = (self.max_question_tokens + self.max_answer_tokens) // self.page_size + 1
        return self.max_batch_size * per_req

    def question_workspace_bytes(self) -> int:
        return self.max_batch_size * self.max_question_tokens * self.num_qo_heads * 8 + (32 << 20)

    def cite_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * 16 * (self.head_dim + 1) * 4
