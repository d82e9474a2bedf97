from dataclasses import dataclass, field
from typing import Tuple

PAGE_SIZE = 32
assert PAGE_SIZE in (16, 32, 64), "FlashInfer paged kernels are built for these page sizes"  # ok: FC109

# per-role workspace sizes in MiB, one entry per wrapper family
_WS_MIB = {"decode": 128, "prefill": 384}


def split_heads(num_heads: int, tp_size: int) -> int:
    assert num_heads % tp_size == 0, "heads must split evenly over the TP group"  # expect: FC109
    return num_heads // tp_size


@dataclass
class HybridConfig:
    num_layers: int = 80
    hidden_size: int = 8192
    num_qo_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    tp_size: int = 4
    pp_size: int = 2
    num_microbatches: int = 2
    max_batch_size: int = 256
    max_pages: int = 1 << 18
    max_chunk_tokens: int = 2048
    graph_batch_sizes: Tuple[int, ...] = (8, 16, 32, 64, 128)
    use_trtllm_decode: bool = False
    max_seq_len: int = 131072
    stop_ids: Tuple[int, ...] = field(default_factory=tuple)

    @property
    def heads_per_rank(self) -> int:
        return split_heads(self.num_qo_heads, self.tp_size)

    @property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.num_kv_heads // self.tp_size)

    def layers_of(self, stage: int) -> Tuple[int, int]:
        per = self.num_layers // self.pp_size
        return stage * per, (stage + 1) * per
