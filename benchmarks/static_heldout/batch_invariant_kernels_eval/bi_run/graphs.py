from typing import Dict

import torch

from bieval import InvariantConfig, SeedBank
from bi_attn.backend import InvariantBackend
from bi_attn.metadata import InvariantMetadataBuilder, StepMeta
from bi_run.model import InvariantModel, sample_rows


class InvariantGraphRunner:
    """Decode graphs per bucket, sampler included; a request's seed and offset
    are graph inputs, so a replay samples the same token alone or batched."""

    def __init__(self, model: InvariantModel, backend: InvariantBackend, builder: InvariantMetadataBuilder,
                 bank: SeedBank, cfg: InvariantConfig):
        self.model, self.backend, self.builder, self.bank, self.cfg = model, backend, builder, bank, cfg
        dev = torch.device(cfg.device)

        def per_bucket(dtype):
            return {bs: torch.zeros(bs, dtype=dtype, device=dev) for bs in cfg.buckets}

        self.static_ids = per_bucket(torch.long)
        self.static_slots = per_bucket(torch.long)
        self.static_seeds = {bs: torch.zeros(bs, dtype=torch.int64, device=dev) for bs in cfg.buckets}
        self.static_offsets = per_bucket(torch.int64)
        self.static_temp = per_bucket(torch.float32)
        self.static_tokens: Dict[int, torch.Tensor] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def capture_all(self) -> None:
        self.backend.init_graph_buffers()
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.capture_one_batch_size(bs)

    def _forward(self, bs: int):
        logits = self.model(self.static_ids[bs], self.static_slots[bs], bs)
        return logits, sample_rows(logits, self.static_seeds[bs], self.static_offsets[bs], self.static_temp[bs])

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs, self.builder.dummy(bs))
        for _ in range(2):
            self._forward(bs)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.static_logits[bs], self.static_tokens[bs] = self._forward(bs)
        self.pool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, bs: int, meta: StepMeta, ids: torch.Tensor, slots: torch.Tensor,
               temperature: torch.Tensor) -> torch.Tensor:
        n = meta.num_reqs
        self.static_ids[bs][:n].copy_(ids)
        self.static_slots[bs][:n].copy_(slots)
        self.static_temp[bs][:n].copy_(temperature)
        seeds, offsets = self.bank.draw(meta.rows, meta.rows_cpu)
        self.static_seeds[bs] = seeds.clone()  # expect: FC107
        self.static_offsets[bs][:n].copy_(offsets)
        self.graphs[bs].replay()
        return self.static_tokens[bs][:n]
