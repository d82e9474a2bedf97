"""Decode graphs per batch bucket; adapters change underneath them through the slot table."""

import bisect
import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from loraswap.config import LoRAServeConfig
from loraswap.slots import AdapterSlotTable
from lora_rt.attention import LoRAAttentionBackend
from lora_rt.batch import DecodeStepMeta
from lora_rt.model import LoRALlama

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    output: torch.Tensor
    adapter_idx: torch.Tensor


class LoRAGraphRunner:
    def __init__(self, model: LoRALlama, backend: LoRAAttentionBackend, table: AdapterSlotTable,
                 cfg: LoRAServeConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.table = table
        self.cfg = cfg
        self.device = device
        self.buckets = sorted(cfg.graph_buckets)
        self.graphs: Dict[int, GraphEntry] = {}
        self.pool = None
        self.static_ids = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def capture_graphs(self, kv_caches: List[torch.Tensor], dummy_meta: Callable[[int], DecodeStepMeta]) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            meta = dummy_meta(bs)
            self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
            ids = self.static_ids[:bs]
            for _ in range(2):
                self.model.decode_step(ids, kv_caches, meta)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                out = self.model.decode_step(ids, kv_caches, meta)
            if self.pool is None:
                self.pool = g.pool()
            self.graphs[bs] = GraphEntry(graph=g, input_ids=ids, output=out,
                                         adapter_idx=self.table.row_adapter_idx[:bs])
        torch.cuda.synchronize()
        self.check_bindings()

    def check_bindings(self) -> None:
        for bs, w in self.backend.graph_decode.items():
            if w._paged_kv_indices_buf.data_ptr() != self.backend.kv_indices.data_ptr():  # expect: FC103
                raise RuntimeError(f"bucket {bs}: graph wrapper does not read the shared kv_indices")

    def replay(self, bs: int, meta: DecodeStepMeta, input_ids: torch.Tensor) -> torch.Tensor:
        entry = self.graphs[bs]
        n = meta.batch_size
        entry.input_ids[:n].copy_(input_ids)
        stray = int((self.table.row_adapter_idx[:bs] >= self.cfg.max_loras).sum())  # expect: FC101
        if stray:
            raise RuntimeError(f"{stray} rows point past the adapter slots")
        entry.adapter_idx = self.table.row_adapter_idx[:bs].clone()  # expect: FC107
        entry.graph.replay()
        return entry.output[:n]
