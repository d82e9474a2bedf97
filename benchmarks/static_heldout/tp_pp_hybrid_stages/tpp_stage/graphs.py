"""Per-stage CUDA graphs: one per (micro-batch row, decode bucket, chunk bucket)."""

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Tuple

import torch

from tpp.config import HybridConfig
from tpp.metadata import MicroBatch
from tpp_stage.attention import StageAttention

if TYPE_CHECKING:
    from tpp_stage.worker import PipelineStage

logger = logging.getLogger(__name__)


@dataclass
class StaticInputs:
    static_hidden: torch.Tensor
    static_positions: torch.Tensor


class StageGraphs:
    _STATIC = ("static_hidden", "static_positions")

    def __init__(self, cfg: HybridConfig, model: "PipelineStage", attn: StageAttention, device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.device = device
        n = attn.max_tokens
        self.static_hidden = torch.zeros(n, cfg.hidden_size, dtype=torch.bfloat16, device=device)
        self.static_positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.outputs: Dict[Tuple[int, int, int], torch.Tensor] = {}
        self.graphs: Dict[Tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def record_bucket(self, mb: MicroBatch, bs: int, chunk: int) -> None:
        n = bs + chunk
        self.attn.prepare_microbatch(mb, bs)
        for _ in range(2):
            self.model.forward_tokens(self.static_hidden[:n], self.static_positions[:n], mb.index, bs, chunk)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_tokens(self.static_hidden[:n], self.static_positions[:n], mb.index, bs, chunk)
        self.graphs[(mb.index, bs, chunk)] = g
        self.outputs[(mb.index, bs, chunk)] = out

    def has(self, m: int, bs: int, chunk: int) -> bool:
        return (m, bs, chunk) in self.graphs

    def replay_mb(self, mb: MicroBatch, inputs: StaticInputs, bs: int, chunk: int) -> torch.Tensor:
        n = mb.num_decode + mb.num_chunk_tokens
        if inputs.static_hidden.shape[0] > self.static_hidden.shape[0]:
            # a longer chunk than any captured one: take the caller's buffers wholesale
            for name in self._STATIC:
                setattr(self, name, getattr(inputs, name).clone())  # expect: FC107
        else:
            self.static_hidden[:n].copy_(inputs.static_hidden[:n])
            self.static_positions[:n].copy_(inputs.static_positions[:n])
        self.graphs[(mb.index, bs, chunk)].replay()
        return self.outputs[(mb.index, bs, chunk)][:n]
