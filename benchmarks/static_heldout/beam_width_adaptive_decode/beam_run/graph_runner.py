import logging
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from beam_attn.backend import BeamAttentionBackend
from beam_attn.metadata import BeamDecodeMetadata
from beamserve.config import BeamConfig

from .model import BeamLM

logger = logging.getLogger(__name__)


@dataclass
class BucketGraph:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    logprobs: torch.Tensor


class BeamGraphRunner:
    """One decode graph per (batch bucket, beam bucket)."""

    def __init__(self, cfg: BeamConfig, model: BeamLM, backend: BeamAttentionBackend, kv_cache: torch.Tensor):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.graphs: Dict[Tuple[int, int], BucketGraph] = {}
        self.pool = None
        self.static_tokens = torch.zeros(cfg.max_rows, dtype=torch.int64, device=backend.device)
        self.static_parent: Optional[torch.Tensor] = None
        self.topk_scratch: Optional[torch.Tensor] = None

    def _dummy_metadata(self, batch: int, beam: int) -> BeamDecodeMetadata:
        rows = batch * beam
        indptr = torch.arange(rows + 1, dtype=torch.int32)
        return BeamDecodeMetadata(
            batch=batch, beam=beam, rows=rows,
            kv_indptr=indptr.to(self.backend.device),
            kv_indptr_host=indptr,
            kv_indices=torch.zeros(rows, dtype=torch.int32, device=self.backend.device),
            kv_last_page_len_host=torch.ones(rows, dtype=torch.int32),
            beam_scores=torch.zeros(rows, device=self.backend.device),
            parent_rows=torch.arange(rows, device=self.backend.device),
            wide=beam >= self.cfg.max_beam,
            graph_key=(batch, beam),
        )

    def capture_one_batch_size(self, batch: int, beam: int) -> None:
        rows = batch * beam
        md = self._dummy_metadata(batch, beam)
        self.backend.init_forward_metadata_replay_cuda_graph(md, (batch, beam))
        torch.cuda.synchronize()  # ok: FC101
        tokens = self.static_tokens[:rows]
        for _ in range(2):
            out = self.model.decode_step(tokens, self.kv_cache, md)
        warm_max = out.abs().max().item()  # expect: FC101
        logger.info("warm-up for bucket (%d, %d): max |logprob| %.1f", batch, beam, warm_max)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.decode_step(tokens, self.kv_cache, md)
        self.pool = g.pool()
        self.graphs[(batch, beam)] = BucketGraph(graph=g, tokens=tokens, logprobs=out)

    def capture_all(self) -> None:
        for b in reversed(self.cfg.batch_buckets):
            for k in reversed(self.cfg.beam_buckets):
                self.capture_one_batch_size(b, k)

    def replay(self, md: BeamDecodeMetadata, tokens: torch.Tensor) -> torch.Tensor:
        key = md.graph_key
        entry = self.graphs[key]
        self.backend.init_forward_metadata_replay_cuda_graph(md, key)
        entry.tokens[: md.rows].copy_(tokens, non_blocking=True)
        if self.static_parent is None or self.static_parent.numel() < md.rows:
            self.static_parent = torch.empty(md.rows, dtype=torch.int64, device=tokens.device)  # expect: FC107
        self.static_parent[: md.rows].copy_(md.parent_rows[: md.rows])
        if self.topk_scratch is None:
            self.topk_scratch = torch.empty(self.cfg.max_rows, 2 * self.cfg.max_beam, device=tokens.device)  # ok: FC107
        entry.graph.replay()
        return entry.logprobs[: md.rows]
