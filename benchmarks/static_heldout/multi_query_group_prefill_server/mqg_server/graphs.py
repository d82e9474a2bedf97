from typing import Dict

import torch

from mqg import ServerConfig
from mqg_attn.backend import DecodeRows, RaggedPrefillBackend
from mqg_server.model import PrefillModel


class DecodeGraphs:
    def __init__(self, cfg: ServerConfig, model: PrefillModel, backend: RaggedPrefillBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        self.static_ids = torch.zeros(cfg.max_decode_batch, dtype=torch.int64, device=device)
        self.static_loc = torch.zeros(cfg.max_decode_batch, dtype=torch.int64, device=device)
        self.outputs: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def _dummy_rows(self, bs: int) -> DecodeRows:
        dev = self.device
        return DecodeRows(
            kv_indptr_host=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=dev),
            last_page_host=torch.ones(bs, dtype=torch.int32).pin_memory(),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=dev),
            block_table=torch.zeros(bs, 1, dtype=torch.int32, device=dev),
            group_qo_indptr_host=torch.zeros(1, dtype=torch.int32),
            group_kv_indptr_host=torch.zeros(1, dtype=torch.int32),
            group_indices=torch.zeros(0, dtype=torch.int32, device=dev),
            group_last_page_host=torch.zeros(0, dtype=torch.int32),
            num_groups=0,
            max_seq_len=1,
        )

    def record(self, bs: int) -> None:
        self.backend.plan_decode_bucket(self._dummy_rows(bs), bs)
        self.model.forward_decode(self.static_ids[:bs], self.static_loc[:bs], bs)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bs] = self.model.forward_decode(self.static_ids[:bs], self.static_loc[:bs], bs)
        self.pool = graph.pool()
        self.graphs[bs] = graph

    def record_all(self) -> None:
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.record(bs)

    def replay(self, rows: DecodeRows, ids: torch.Tensor, loc: torch.Tensor, bucket: int) -> torch.Tensor:
        bs = rows.batch_size
        self.static_ids[:bs].copy_(ids)
        self.static_loc[:bs].copy_(loc)
        self.backend.plan_decode_bucket(rows, bucket)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:bs]
