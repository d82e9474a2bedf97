"""Decode + sampling captured together, one graph per batch bucket."""

from __future__ import annotations

import bisect
import logging
from typing import Dict, Optional

import numpy as np
import torch

from seedserve.batch import DecodeBatch
from seedserve.config import ServeConfig
from seedserve.rng import SeedTable
from seedserve.sampler import GraphSampler

from .backend import SeededAttnBackend
from .model import SeedDecoder

logger = logging.getLogger(__name__)


class DecodeGraphs:
    def __init__(
        self,
        cfg: ServeConfig,
        model: SeedDecoder,
        backend: SeededAttnBackend,
        seed_table: SeedTable,
        sampler: GraphSampler,
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.seed_table = seed_table
        self.sampler = sampler
        self.batch_sizes = sorted(cfg.graph_batch_sizes)
        n = self.batch_sizes[-1]
        backend.init_graph_buffers(self.batch_sizes)
        self.slots = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.temps = torch.ones(n, dtype=torch.float32, device=device)
        self.seeded = torch.zeros(n, dtype=torch.bool, device=device)
        self.seeds = torch.zeros(n, dtype=torch.int64, device=device)
        self.offsets = torch.zeros(n, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.out_ids: Dict[int, torch.Tensor] = {}
        self.mempool = None

    def bucket(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self.batch_sizes, bs)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def _static_batch(self, bs: int) -> DecodeBatch:
        return DecodeBatch(
            reqs=[],
            slots=self.slots[:bs],
            positions=self.positions[:bs],
            temps=self.temps[:bs],
            seeded=self.seeded[:bs],
            kv_indptr=self.backend.kv_indptr[: bs + 1],
            kv_indices=self.backend.kv_indices,
            kv_last_page_len=self.backend.kv_last_page_len[:bs],
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            num_logprobs_np=np.zeros(bs, dtype=np.int32),
        )

    def _body(self, bs: int, fb: DecodeBatch) -> torch.Tensor:
        # the previous step's sampled ids never leave the device
        input_ids = self.seed_table.last_token[self.slots[:bs]]
        logits = self.model.forward_decode(input_ids, fb)
        ids = self.sampler.sample(logits, self.temps[:bs], self.seeds[:bs], self.offsets[:bs], self.seeded[:bs])
        # advanced offsets and the sampled ids go back to the per-slot tables
        self.seed_table.offsets.index_copy_(0, self.slots[:bs], self.offsets[:bs])
        self.seed_table.set_last_tokens(self.slots[:bs], ids)
        return ids

    def capture_all(self) -> None:
        for bs in reversed(self.batch_sizes):
            w = self.backend.graph_decode[bs]
            if not hasattr(w, "_cached_module"):  # expect: FC103
                logger.info("bucket %d: decode kernels not loaded yet; warm-up will JIT them", bs)
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        warm = self._body(bs, fb)
        if warm.max().item() >= self.cfg.vocab_size:  # expect: FC101
            raise RuntimeError(f"warm-up sampling produced an out-of-vocab id for bucket {bs}")
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        g.register_generator_state(self.sampler.generator)
        with torch.cuda.graph(g, pool=self.mempool):
            out = self._body(bs, fb)
        if self.mempool is None:
            self.mempool = g.pool()
        self.graphs[bs] = g
        self.out_ids[bs] = out

    def replay(self, fb: DecodeBatch) -> torch.Tensor:
        real = fb.batch_size
        bs = self.bucket(real)
        if not torch.equal(self.slots[:real], fb.slots):  # expect: FC101
            self.slots[:real].copy_(fb.slots)
        self.slots[real:bs].zero_()
        self.positions[:real].copy_(fb.positions, non_blocking=True)
        self.temps[:real].copy_(fb.temps, non_blocking=True)
        self.seeded[:real].copy_(fb.seeded, non_blocking=True)
        torch.index_select(self.seed_table.seeds, 0, self.slots[:bs], out=self.seeds[:bs])
        torch.index_select(self.seed_table.offsets, 0, self.slots[:bs], out=self.offsets[:bs])
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.out_ids[bs][:real]
