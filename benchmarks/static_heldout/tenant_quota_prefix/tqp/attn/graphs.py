"""Decode CUDA graphs, one per batch-size bucket, sharing the backend's graph buffers."""
import bisect
import logging
from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from tqp.attn.backend import StepBatch, TenantFlashInferBackend
from tqp.config import ServerConfig

if TYPE_CHECKING:
    from tqp.server import TinyTenantLM

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, model: "TinyTenantLM", backend: TenantFlashInferBackend, cfg: ServerConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.buckets: List[int] = sorted(cfg.cuda_graph_bs)
        self.max_bs = self.buckets[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        device = backend.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        backend.init_cuda_graph_state(self.max_bs, cfg.num_pages)

    def bucket_for(self, raw_bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, raw_bs)
        return self.buckets[i] if i < len(self.buckets) else None

    def capture(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        logger.info("captured %d decode graphs", len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(
            bs,
            num_pages=bs,
            max_seq_len=int(self.seq_lens[:bs].max()),  # expect: FC101
        )
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(self.input_ids[:bs], self.positions[:bs])
        self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, fb: StepBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.bucket_for(raw_bs)
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
