from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

SPLIT_OPS = ("sglang.unified_attention_with_output",)


@dataclass
class CompilationConfig:
    capture_sizes: List[int] = field(default_factory=lambda: [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
    compile_sizes: List[int] = field(default_factory=list)
    cudagraph_num_of_warmups: int = 1
    splitting_ops: tuple = SPLIT_OPS
    debug_mode: bool = False

    def add_split_op(self, op: str) -> None:
        self.splitting_ops = (*self.splitting_ops, op)
