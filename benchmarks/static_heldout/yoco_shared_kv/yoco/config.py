from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import List, Optional, Sequence


@dataclass
class YocoConfig:
    hidden_size: int = 4096
    num_self_layers: int = 16
    num_cross_layers: int = 16
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    # self-decoder layers alternate a short and, every ``wide_every`` layers, a wide sliding window
    local_window: int = 1024
    wide_window: int = 8192
    wide_every: int = 4
    rope_theta: float = 500000.0

    def is_wide(self, layer_id: int) -> bool:
        return (layer_id + 1) % self.wide_every == 0


@dataclass
class ServerArgs:
    model_path: str = ""
    page_size: int = 16
    max_running_requests: int = 256
    max_context_len: int = 262144
    cuda_graph_max_bs: int = 160
    cuda_graph_bs: Optional[List[int]] = None
    cross_workspace_mb: int = 512
    is_blackwell: bool = False
    disable_cuda_graph: bool = False
    mem_fraction_static: float = 0.85
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_cli(cls, argv: Sequence[str]) -> "ServerArgs":
        p = argparse.ArgumentParser("yoco-server")
        p.add_argument("--model-path", required=True)
        p.add_argument("--page-size", type=int, default=16)
        p.add_argument("--max-running-requests", type=int, default=256)
        p.add_argument("--max-context-len", type=int, default=262144)
        p.add_argument("--cuda-graph-max-bs", type=int, default=160)
        p.add_argument("--cross-workspace-mb", type=int, default=512)
        p.add_argument("--disable-cuda-graph", action="store_true")
        ns = p.parse_args(list(argv))
        import torch

        major, _ = torch.cuda.get_device_capability()
        return cls(
            model_path=ns.model_path,
            page_size=ns.page_size,
            max_running_requests=ns.max_running_requests,
            max_context_len=ns.max_context_len,
            cuda_graph_max_bs=ns.cuda_graph_max_bs,
            cross_workspace_mb=ns.cross_workspace_mb,
            is_blackwell=major >= 10,
            disable_cuda_graph=ns.disable_cuda_graph,
        )

    @property
    def graph_batch_sizes(self) -> List[int]:
        if self.cuda_graph_bs:
            return sorted(self.cuda_graph_bs)
        sizes = [1, 2, 4] + list(range(8, self.cuda_graph_max_bs + 1, 8))
        return [b for b in sizes if b <= self.cuda_graph_max_bs]


def _default_window_workspace_bytes() -> int:
    # window decode never splits much: the page lists are short
    return 256 * 1024 * 1024
