"""One decode graph per batch size; padded slots are dummy requests holding a single page."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..attention_backend import Fp8FlashInferMetadata


class DecodeGraphRunner:
    def __init__(self, engine, batch_sizes: list[int]) -> None:
        self.engine = engine
        self.metadata: "Fp8FlashInferMetadata" = engine.attn_metadata
        self.batch_sizes = sorted(batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        with torch.device("cuda"):
            self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64)
            self.slots = torch.zeros(self.max_bs, dtype=torch.int64)

    def capture_all(self) -> None:
        for bs in reversed(self.batch_sizes):
            self._build_graph(bs)

    def _set_generation_batch(self, kv_lens: list[int], bs: int) -> None:
        md = self.metadata
        md.is_cuda_graph, md.num_contexts = True, 0
        md.request_kv_lens = list(kv_lens) + [1] * (bs - len(kv_lens))
        md.request_q_lens = [1] * bs

    def _build_graph(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.metadata.create_graph_decode_wrapper(bs)
        self._set_generation_batch([1] * bs, bs)
        self.metadata.prepare()
        model = self.engine.model
        for _ in range(2):
            model(self.input_ids[:bs], self.slots[:bs], self.metadata)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs[bs] = model(self.input_ids[:bs], self.slots[:bs], self.metadata)
        self.graphs[bs] = graph

    def replay(self, input_ids: torch.Tensor, slots: torch.Tensor, kv_lens: list[int]) -> torch.Tensor:
        num_real = len(kv_lens)
        bs = next(b for b in self.batch_sizes if b >= num_real)
        self.input_ids[:num_real].copy_(input_ids, non_blocking=True)
        self.slots[:num_real].copy_(slots, non_blocking=True)
        self._set_generation_batch(kv_lens, bs)
        md = self.metadata
        md.prepare()
        # dummy slots should read no pages at all
        md.kv_indptr_cuda[num_real + 1 : bs + 1] = md.kv_indptr_cuda[num_real]  # expect: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][:num_real]
