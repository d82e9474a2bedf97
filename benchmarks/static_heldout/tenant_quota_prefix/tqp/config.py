"""Server limits and FlashInfer sizing."""
from dataclasses import dataclass, field
from typing import Dict, Tuple

# Decode split-k workspace; fixed when every tenant ran an 8B model at batch 64.
DECODE_WORKSPACE_MB = 256


@dataclass
class TenantSpec:
    name: str
    max_pages: int
    priority: int = 0
    system_prompt_tokens: int = 0


@dataclass
class ServerConfig:
    num_pages: int = 65536
    page_size: int = 16
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    num_layers: int = 32
    vocab_size: int = 128256
    eos_token_id: int = 2
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    use_trtllm_decode: bool = False
    admission_watermark: float = 0.05
    tenants: Dict[str, TenantSpec] = field(default_factory=dict)

    @property
    def prefill_workspace_bytes(self) -> int:
        # split-k partial outputs and LSE for the largest chunk, fp32
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    @property
    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * self.head_dim * 4 * 16

    def pages_for(self, num_tokens: int) -> int:
        return (num_tokens + self.page_size - 1) // self.page_size
