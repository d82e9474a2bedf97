"""Decode CUDA graphs per batch size on one TP rank, captured under the custom all-reduce's capture()."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from tpserve.attention import FIXED_BS_ATTR, ModelConfig, RankAttention, StepBatch
from tpserve.comm.custom_allreduce import CustomAllreduce, get_tp_group
from tpserve.model import TPModel

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(
        self, model: TPModel, attn: RankAttention, ca: Optional[CustomAllreduce], cfg: ModelConfig, device
    ) -> None:
        self.model = model
        self.attn = attn
        self.ca = ca
        self.cfg = cfg
        self.device = device
        self.capture_bs = list(cfg.capture_bs)
        max_bs = self.capture_bs[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.logits: Optional[torch.Tensor] = None
        self.kv_caches: List[torch.Tensor] = []
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.last_seq_lens_cpu: Optional[torch.Tensor] = None

    def _forward(self, bs: int) -> torch.Tensor:
        return self.model(self.input_ids[:bs], self.positions[:bs], self.out_cache_loc[:bs], self.kv_caches)

    def capture(self, kv_caches: List[torch.Tensor]) -> None:
        self.kv_caches = kv_caches
        self.logits = torch.zeros(self.capture_bs[-1], self.model.lm_head.out_features, device=self.device)
        torch.cuda.synchronize()  # ok: FC101
        ctx = self.ca.capture() if self.ca is not None else torch.no_grad()
        with ctx:
            for bs in reversed(self.capture_bs):
                self.capture_one_batch_size(bs)
        logger.info("rank %d captured %d decode graphs", dist.get_rank(), len(self.graphs))

    def capture_one_batch_size(self, bs: int) -> None:
        self.attn.init_forward_metadata_capture_cuda_graph(bs)
        if getattr(self.attn.graph_wrappers[bs], FIXED_BS_ATTR) != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} was built for another batch size")
        if self.ca is not None and bs == self.capture_bs[-1]:
            # trust the custom all-reduce inside graphs only after it agreed with NCCL once
            probe = torch.randn(bs, self.cfg.hidden_size, dtype=torch.bfloat16, device=self.device)
            ref = probe.clone()
            dist.all_reduce(ref, group=get_tp_group())
            if not torch.allclose(self.ca.all_reduce(probe), ref, atol=1e-2, rtol=1e-2):  # expect: FC101
                raise RuntimeError("custom all-reduce disagrees with NCCL; restart with the custom all-reduce disabled")
        for _ in range(2):  # warm-up: the custom all-reduce returns placeholders outside the capture
            self._forward(bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.logits[:bs] = self._forward(bs)
        self.pool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, batch: StepBatch) -> torch.Tensor:
        raw_bs = batch.batch_size
        bs = next(b for b in self.capture_bs if b >= raw_bs)
        self.input_ids[:raw_bs].copy_(batch.input_ids, non_blocking=True)
        self.positions = torch.cat([batch.positions, self.positions.new_zeros(bs - raw_bs)])  # expect: FC107
        self.out_cache_loc[:raw_bs].copy_(batch.out_cache_loc, non_blocking=True)
        self.last_seq_lens_cpu = batch.seq_lens_cpu.clone()  # ok: FC107
        self.attn.init_forward_metadata_replay_cuda_graph(
            bs, raw_bs, batch.seq_lens, batch.seq_lens_cpu, batch.page_table_np
        )
        self.graphs[bs].replay()
        return self.logits[:raw_bs]
