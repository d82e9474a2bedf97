import logging
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ev_engine.backend import EventAwareBackend
from ev_engine.batch import EventBatch
from ev_engine.config import EventEngineConfig
from ev_engine.model import EventLM

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class EventGraphRunner:
    def __init__(self, model: EventLM, backend: EventAwareBackend, cfg: EventEngineConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.buckets = sorted(cfg.decode_buckets)
        mb = self.buckets[-1]
        self.backend.init_cuda_graph_state(mb)
        self.input_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.sampled = torch.zeros(mb, dtype=torch.int64, device=device)
        self.graphs: Dict[int, GraphEntry] = {}
        self.last_nnz = 0
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids, pos = self.input_ids[:bs], self.positions[:bs]
        self.model.forward_decode(ids, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model.forward_decode(ids, bs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = GraphEntry(graph=g, input_ids=ids, positions=pos, logits=logits)

    def replay(self, fb: EventBatch) -> torch.Tensor:
        real = fb.batch_size
        bs = self.bucket_for(real)
        if bs is None:
            raise ValueError(f"no captured graph for {real} rows (seq_lens={fb.seq_lens})")  # ok: FC101
        logger.info(f"replay bs={bs} real={real} seq_lens={fb.seq_lens}")  # expect: FC101
        entry = self.graphs[bs]
        entry.input_ids[:real].copy_(fb.input_ids)
        entry.positions = fb.positions.clone()  # expect: FC107
        self.last_nnz = self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        entry.graph.replay()
        return entry.logits[:real]

    def sample(self, logits: torch.Tensor, real: int) -> torch.Tensor:
        torch.argmax(logits, dim=-1, out=self.sampled[:real])
        return self.sampled[:real]
