"""Decode graphs per (local bucket, global MoE bucket); an idle rank replays a dummy graph."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from dpmoe import DPConfig, MoEPadPlan
from dp_attn.backend import DPAttentionBackend
from dp_attn.meta import DPStepMeta
from dp_run.model import DPModel

# the wrapper buffers every graph of a bucket shares with the backend
_BOUND_BUFS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


class DPGraphRunner:
    def __init__(self, model: DPModel, backend: DPAttentionBackend, cfg: DPConfig, device: torch.device) -> None:
        self.model, self.backend, self.cfg, self.device = model, backend, cfg, device
        max_bs = cfg.max_graph_bs
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[Tuple[int, int, bool], Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # the batch size each graph was captured for (the engine's record, not FlashInfer's)
        self._fixed_batch_size: Dict[Tuple[int, int, bool], int] = {}  # ok: FC103
        self.mempool = None

    def record_all(self) -> None:
        for gbs in self.cfg.global_buckets:
            for bs in self.cfg.graph_buckets:
                self.record_shape(bs, gbs, False)
            self.record_shape(1, gbs, True)
        self.check_shared_buffers()

    def record_shape(self, bs: int, gbs: int, dummy: bool) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs, gbs, dummy)
        self.model.set_pad_plan(MoEPadPlan.uniform(gbs, self.cfg.dp_size, self.device))
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.forward_graph(self.static_ids[:bs], self.static_slots[:bs])
        self.mempool = graph.pool()
        self.graphs[(bs, gbs, dummy)] = (graph, logits)
        self._fixed_batch_size[(bs, gbs, dummy)] = bs

    def check_shared_buffers(self) -> None:
        for key, w in self.backend.graph_wrappers.items():
            if not w._use_cuda_graph:  # expect: FC103
                raise RuntimeError(f"decode graph {key} was built without use_cuda_graph")
            for name in _BOUND_BUFS:
                if getattr(w, name) is None:  # expect: FC103
                    raise RuntimeError(f"decode graph {key} has no {name}")

    def replay(self, meta: DPStepMeta, input_ids: torch.Tensor, slots: torch.Tensor, gbs: int) -> torch.Tensor:
        n = meta.num_seqs
        bs = self.cfg.bucket_for(n)
        self.backend.prepare_graph_inputs(meta, bs, gbs)
        self.static_ids[:n].copy_(input_ids, non_blocking=True)
        self.static_slots[:n].copy_(slots, non_blocking=True)
        graph, logits = self.graphs[(bs, gbs, False)]
        graph.replay()
        return logits[:n]

    def replay_dummy(self, gbs: int) -> None:
        self.backend.plan_dummy(1)
        self.graphs[(1, gbs, True)][0].replay()
