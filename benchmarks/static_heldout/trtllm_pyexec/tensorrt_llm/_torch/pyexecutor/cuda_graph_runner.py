from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import torch

if TYPE_CHECKING:
    from .model_engine import PyTorchModelEngine


class CUDAGraphRunner:
    def __init__(self, engine: PyTorchModelEngine, batch_sizes):
        self.engine = engine
        self.batch_sizes = sorted(batch_sizes)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_outputs = {}
        self.memory_pool = None

    def capture(self, batch_size: int, inputs):
        graph = torch.cuda.CUDAGraph()
        for _ in range(2):
            self.engine.forward_step(inputs)
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.graph(graph, pool=self.memory_pool):
            out = self.engine.forward_step(inputs)
        self.memory_pool = graph.pool()
        self.graphs[batch_size] = graph
        self.static_outputs[batch_size] = out

    def padded_batch_size(self, batch_size: int):
        for bs in self.batch_sizes:
            if bs >= batch_size:
                return bs
        return None

    def replay(self, batch_size: int, inputs):
        static_inputs = self.engine.static_inputs[batch_size]
        static_inputs["input_ids"][: inputs["input_ids"].shape[0]].copy_(inputs["input_ids"])
        self.graphs[batch_size].replay()
        return self.static_outputs[batch_size]
