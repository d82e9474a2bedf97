"""CUDA graphs for generation-only batches.

One graph per batch size, captured with dummy generation requests that the KV cache manager holds for the
lifetime of the executor. Each graph has its own metadata copy (``is_cuda_graph=True``) whose wrappers run in
graph mode over that copy's buffers; before a replay the executor calls ``prepare`` on that copy.
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from tensorrt_llm.bindings import LlmRequest
from tensorrt_llm._torch.attention_backend.fi_metadata import FlashInferAttentionMetadata

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    logits: torch.Tensor


class CUDAGraphRunner:
    def __init__(
        self, model, metadata: FlashInferAttentionMetadata, kv_caches: List[torch.Tensor], batch_sizes: List[int],
        max_draft_len: int, device: str = "cuda",
    ) -> None:
        self.model = model
        self.metadata = metadata
        self.kv_caches = kv_caches
        self.batch_sizes = sorted(batch_sizes)
        self.max_draft_len = max_draft_len
        self.tokens_per_req = 1 + max_draft_len
        self.device = device
        max_tokens = self.batch_sizes[-1] * self.tokens_per_req
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.position_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.graphs: Dict[int, GraphEntry] = {}
        self.graph_metadata: Dict[int, FlashInferAttentionMetadata] = {}
        # logits are copied out of the graph's output so that the next replay cannot overwrite them while the
        # response thread still samples from them; sized for the largest bucket on the first replay
        self.logits_out: Optional[torch.Tensor] = None
        self.pool = None

    def bucket_for(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.batch_sizes, bs)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def metadata_for(self, bs: int) -> FlashInferAttentionMetadata:
        return self.graph_metadata[self.bucket_for(bs)]

    # ------------------------------------------------------------------ capture

    def capture_all(self, dummy_requests: List[LlmRequest]) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.batch_sizes):
            self._capture_one(bs, dummy_requests[:bs])
        torch.cuda.synchronize()

    def _capture_one(self, bs: int, reqs: List[LlmRequest]) -> None:
        graph_meta: FlashInferAttentionMetadata = self.metadata.create_cuda_graph_metadata(bs)
        graph_meta.prepare(reqs)
        if getattr(graph_meta.decode_wrapper, "_cached_module", None) is None:  # expect: FC103
            logger.info("decode kernels for bs=%d are JIT-compiled during the warm-up runs", bs)
        n = bs * self.tokens_per_req
        for _ in range(2):
            self._forward(n, graph_meta)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(n, graph_meta)
        self.pool = graph.pool()
        # input ids as [bs, 1 + max_draft_len]: the new token then the drafts of each request
        self.graphs[bs] = GraphEntry(graph, self.input_ids[:n].view(bs, self.tokens_per_req), self.position_ids[:n], logits)
        self.graph_metadata[bs] = graph_meta
        logger.info(f"captured generation graph bs={bs}, dummy kv lens {graph_meta.kv_lens_cuda[:bs]}")  # expect: FC101

    def _forward(self, n: int, meta: FlashInferAttentionMetadata) -> torch.Tensor:
        return self.model(self.input_ids[:n], self.position_ids[:n], self.kv_caches, meta)

    # ------------------------------------------------------------------ replay

    def replay(
        self, bs_real: int, new_tokens: torch.Tensor, draft_tokens: torch.Tensor, position_ids: torch.Tensor,
    ) -> torch.Tensor:
        bs = self.bucket_for(bs_real)
        entry = self.graphs[bs]
        n = bs_real * self.tokens_per_req
        if self.max_draft_len > 0:
            # [new token, drafts...] per request, like the captured layout
            entry.input_ids = torch.cat([new_tokens, draft_tokens], dim=1)  # expect: FC107
        else:
            entry.input_ids[:bs_real].copy_(new_tokens)
        entry.position_ids[:n].copy_(position_ids[:n])
        if self.logits_out is None:
            largest = self.graphs[self.batch_sizes[-1]].logits
            self.logits_out = torch.empty_like(largest)  # ok: FC107
        entry.graph.replay()
        out = self.logits_out[:n]
        out.copy_(entry.logits[:n])
        return out
