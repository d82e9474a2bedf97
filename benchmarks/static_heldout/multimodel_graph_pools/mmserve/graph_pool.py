"""One CUDA graph memory pool per resident model.

Graphs of different models never share a pool, so evicting a model frees its
graphs' memory without touching the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from mmserve.attn.backend import PerModelAttnBackend
from mmserve.batch import StepBatch
from mmserve.model import ResidentDecoder

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class ModelGraphPool:
    def __init__(self, model_id: str, model: ResidentDecoder, backend: PerModelAttnBackend,
                 kv_caches: List[torch.Tensor], batch_sizes: List[int], device: torch.device):
        self.model_id = model_id
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.batch_sizes = sorted(batch_sizes)
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)
        self.entries: Dict[int, GraphEntry] = {}
        self._plan_info: Dict[int, tuple] = {}
        max_bs = self.batch_sizes[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)

    def record_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.batch_sizes):
            self.backend.init_cuda_graph_wrapper(bs)
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()
        logger.info("%s: captured %d decode graphs", self.model_id, len(self.entries))

    def capture_one_batch_size(self, bs: int) -> None:
        w = self.backend.graph_wrappers[bs]
        if not w._use_cuda_graph:  # expect: FC103
            raise RuntimeError(f"{self.model_id}: wrapper for bs={bs} is not in graph mode")
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids = self.static_input_ids[:bs]
        pos = self.static_positions[:bs]
        for _ in range(2):
            self.model(ids, pos, self.kv_caches, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
            logits = self.model(ids, pos, self.kv_caches, bs)
        self.entries[bs] = GraphEntry(graph=g, input_ids=ids, positions=pos, logits=logits)
        self._plan_info[bs] = (self.model_id, bs)  # ok: FC103

    def pick(self, n: int) -> Optional[int]:
        for bs in self.batch_sizes:
            if bs >= n:
                return bs
        return None

    def replay(self, batch: StepBatch) -> torch.Tensor:
        n = batch.input_ids.shape[0]
        bs = self.pick(n)
        entry = self.entries[bs]
        entry.input_ids[:n].copy_(batch.input_ids)
        entry.positions = batch.positions.clone()  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        entry.graph.replay()
        return entry.logits[:n]

    def memory_report(self) -> Dict[str, float]:
        used = torch.cuda.memory_stats(self.device)["allocated_bytes.all.current"]
        peak = self.static_input_ids.new_tensor(used).float().item()  # ok: FC101
        return {"model": self.model_id, "bytes": peak, "graphs": len(self.entries)}

    def release(self) -> None:
        self.entries.clear()
        self.pool = None
