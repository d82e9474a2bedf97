"""Decode graphs per bucket of active branches."""
from typing import Dict, List, Optional

import torch

from convtree import FI_GRAPH_FLAG, ChatServerConfig
from ct_attn.backend import TreeAttnBackend
from ct_attn.metadata import TreeStepMeta

from .model import ChatModel


class TreeGraphRunner:
    def __init__(self, model: ChatModel, backend: TreeAttnBackend, cfg: ChatServerConfig, device: torch.device):
        self.model, self.backend, self.cfg = model, backend, cfg
        self.static_ids = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(cfg.max_bucket, dtype=torch.int32, device=device)
        self.static_positions: Dict[int, torch.Tensor] = {
            bs: torch.zeros(bs, dtype=torch.int64, device=device) for bs in cfg.graph_buckets
        }
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def capture_one_batch_size(self, bs: int, kv_caches: List[torch.Tensor]) -> None:
        # sibling branches decode through the cascade inside the same graphs
        setattr(self.backend.cascade, FI_GRAPH_FLAG, True)  # expect: FC103
        max_len = int(self.static_seq_lens[:bs].max())  # expect: FC101
        self.static_positions[bs].fill_(max_len - 1)
        meta = self.backend.capture_meta(bs, self.static_positions[bs])
        self.backend.init_forward_metadata_capture_cuda_graph(bs, meta)
        self.model.decode(self.static_ids[:bs], kv_caches, bs, meta)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bs] = self.model.decode(self.static_ids[:bs], kv_caches, bs, meta)
        torch.cuda.synchronize()  # ok: FC101
        self.pool = self.pool or graph.pool()
        self.graphs[bs] = graph

    def replay(self, bs: int, input_ids: torch.Tensor, meta: TreeStepMeta) -> torch.Tensor:
        n = meta.num_rows
        self.static_ids[:n].copy_(input_ids)
        self.static_positions[bs] = torch.cat([meta.positions, meta.positions.new_zeros(bs - n)])  # expect: FC107
        self.static_seq_lens[:n].copy_(meta.seq_lens)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
