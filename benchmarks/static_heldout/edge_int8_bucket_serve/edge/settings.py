from dataclasses import dataclass
from typing import Tuple


@dataclass
class EdgeSettings:
    model_dir: str = "/opt/models/gemma3-1b-w8a8"
    num_layers: int = 26
    global_every: int = 6              # five sliding-window layers, then one global layer
    sliding_window: int = 512
    hidden_size: int = 1152
    intermediate_size: int = 6912
    num_qo_heads: int = 4
    num_kv_heads: int = 1
    head_dim: int = 256
    vocab_size: int = 262144
    max_batch: int = 4
    seq_buckets: Tuple[int, ...] = (512, 1024, 2048, 4096)
    page_size: int = 32
    max_prompt: int = 3072
    prefill_chunk: int = 512
    watchdog_timeout_s: float = 2.0
    use_trtllm_decode: bool = False    # Jetson Thor (Blackwell) path
    trtllm_workspace_bytes: int = 32 << 20

    @property
    def pages_per_slot(self) -> int:
        return self.seq_buckets[-1] // self.page_size

    def is_global(self, layer_id: int) -> bool:
        return (layer_id + 1) % self.global_every == 0

    def prefill_workspace_bytes(self) -> int:
        return self.prefill_chunk * self.num_qo_heads * (self.head_dim + 1) * 4 * 4
