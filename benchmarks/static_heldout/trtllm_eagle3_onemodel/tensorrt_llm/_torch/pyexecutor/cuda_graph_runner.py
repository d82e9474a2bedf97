"""Captures the whole generation step (target forward + EAGLE3 draft loop) per batch size."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import torch

from tensorrt_llm._torch.attention_backend.flashinfer import FlashInferAttentionMetadata
from tensorrt_llm._torch.speculative.eagle3 import Eagle3OneModelSpecMetadata

if TYPE_CHECKING:
    from tensorrt_llm._torch.pyexecutor.model_engine import PyTorchModelEngine


class CUDAGraphRunner:
    def __init__(self, engine: "PyTorchModelEngine"):
        self.engine = engine
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_outputs: Dict[int, Dict[str, torch.Tensor]] = {}
        self.graph_metadata: Dict[int, FlashInferAttentionMetadata] = {}
        self.spec_metadata: Dict[int, Eagle3OneModelSpecMetadata] = {}
        self.static_inputs: Dict[int, Dict[str, torch.Tensor]] = {}
        self.memory_pool = None

    def capture(self, batch_size: int) -> None:
        eng = self.engine
        md = eng.attn_metadata.create_cuda_graph_metadata(batch_size)
        spec_md = eng.spec_metadata.create_cuda_graph_metadata(batch_size)
        tokens = batch_size * (1 + eng.max_draft_len)
        inputs = {
            "input_ids": torch.zeros(tokens, dtype=torch.int64, device="cuda"),
            "position_ids": torch.zeros(tokens, dtype=torch.int64, device="cuda"),
        }
        md.request_ids = list(range(batch_size))
        md.num_seqs = batch_size
        md.seq_lens_cpu[:batch_size].fill_(1 + eng.max_draft_len)
        md.kv_lens_cpu[:batch_size].fill_(1 + eng.max_draft_len)
        for rid in md.request_ids:
            eng.kv_cache_manager.add_tokens(rid, 1 + eng.max_draft_len)
        with md.eager_planning():
            md.prepare()
        for _ in range(2):
            eng._forward_step(inputs, md, spec_md)
        torch.cuda.synchronize()
        md.prepare()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory_pool):
            out = eng._forward_step(inputs, md, spec_md)
        self.memory_pool = graph.pool()
        self.graphs[batch_size] = graph
        self.graph_outputs[batch_size] = out
        self.graph_metadata[batch_size] = md
        self.spec_metadata[batch_size] = spec_md
        self.static_inputs[batch_size] = inputs

    def replay(self, batch_size: int, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        static = self.static_inputs[batch_size]
        for name, t in inputs.items():
            static[name][: t.shape[0]].copy_(t)  # ok: FC107
        self.graphs[batch_size].replay()
        return self.graph_outputs[batch_size]
