"""Decode graphs of one tier, captured into that tier's own memory pool."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional

import torch

from tiers.batch import TierBatch

if TYPE_CHECKING:
    from tiers.runtime import TierRuntime


class TierGraphPool:
    def __init__(self, runtime: "TierRuntime"):
        self.runtime = runtime
        self.attn = runtime.attn
        spec = runtime.spec
        self.buckets = sorted(spec.graph_buckets)
        self.max_graph_len = spec.max_graph_context
        mb = spec.max_graph_bs
        dev = runtime.device
        self.input_ids = torch.zeros(mb, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(mb, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(mb, dtype=torch.int32, device=dev)
        self.slots = torch.zeros(mb, dtype=torch.int64, device=dev)
        self.out_loc = torch.zeros(mb, dtype=torch.int64, device=dev)
        self.mempool = torch.cuda.graph_pool_handle()
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}

    def _static_batch(self, bs: int) -> TierBatch:
        return TierBatch(
            batch_size=bs,
            slots=self.slots[:bs],
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=None,
            kv_indptr_cpu=self.attn.kv_indptr_pinned[: bs + 1],
            kv_indices=self.attn.graph_kv_indices,
            last_page_len=self.attn.graph_last_page_len[:bs],
            last_page_len_cpu=self.attn.last_page_len_pinned[:bs],
            out_loc=self.out_loc[:bs],
        )

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        self.attn.init_graph_wrapper(bs)
        static = self._static_batch(bs)
        model = self.runtime.model
        for _ in range(2):
            model.decode(self.input_ids[:bs], self.positions[:bs], static)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            self.logits[bs] = model.decode(self.input_ids[:bs], self.positions[:bs], static)
        self.graphs[bs] = graph

    def replay(self, batch: TierBatch) -> Optional[torch.Tensor]:
        n = batch.batch_size
        if n > self.buckets[-1] or max(batch.seq_lens) > self.max_graph_len:  # expect: FC101
            return None
        bs = next(b for b in self.buckets if b >= n)
        self.input_ids[:n].copy_(batch.input_ids)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.out_loc[:n].copy_(batch.out_loc)
        self.attn.prepare_replay(bs, batch)
        self.positions[:n].copy_(batch.positions)  # ok: FC104
        self.graphs[bs].replay()
        return self.logits[bs][:n]
