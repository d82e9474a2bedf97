from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from abortable import PAD_SLOT, DecodeBatch, EngineConfig
from ab_attn.backend import AbortAwareBackend
from ab_engine.model import AbortableDecoder


class DecodeGraphRunner:
    """One decode graph per bucket; dead rows and rows past the batch are padding."""

    def __init__(self, model: AbortableDecoder, backend: AbortAwareBackend, cfg: EngineConfig, device):
        self.model, self.backend, self.cfg, self.device = model, backend, cfg, device
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        max_bs = self.buckets[-1]
        self.static: Dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(max_bs, dtype=torch.int64, device=device),
            "out_loc": torch.full((max_bs,), PAD_SLOT, dtype=torch.int64, device=device),
        }
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def bucket_for(self, bs: int) -> int:
        for b in self.buckets:
            if b >= bs:
                return b
        raise ValueError(f"batch of {bs} exceeds the largest graph bucket {self.buckets[-1]}")

    def record_all(self) -> None:
        self.backend.init_cuda_graph_state(self.buckets)
        for bs in reversed(self.buckets):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids, loc = self.static["input_ids"][:bs], self.static["out_loc"][:bs]
        self.model.forward_decode(ids, loc, bs)  # warm-up
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            self.outputs[bs] = self.model.forward_decode(ids, loc, bs)
        self.graphs[bs] = g

    def check_bindings(self) -> None:
        for bs, w in self.backend.graph_wrappers.items():
            if w._paged_kv_indptr_buf.data_ptr() != self.backend.kv_indptr.data_ptr():  # expect: FC103
                raise RuntimeError(f"bucket {bs}: indptr buffer was rebound")

    def replay(self, batch: DecodeBatch, dead_rows: np.ndarray) -> torch.Tensor:
        bs = batch.batch_size
        padded = self.bucket_for(bs)
        self.static["input_ids"][:bs].copy_(batch.input_ids)
        # padding rows write their (discarded) KV into the padding slot
        self.static["out_loc"] = batch.out_loc.new_full((padded,), PAD_SLOT)  # expect: FC107
        self.static["out_loc"][:bs] = batch.out_loc
        self.backend.prepare_replay(bs, padded, batch.page_lists, batch.seq_lens_np, dead_rows)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
