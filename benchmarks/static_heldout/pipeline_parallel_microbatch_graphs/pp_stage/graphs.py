"""CUDA graphs per (stage, bucket) for decode microbatches."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ppserve.compat import bucket_capacity, usable_buckets
from ppserve.config import PipelineConfig, StageSpec
from ppserve.microbatch import Microbatch
from pp_stage.attention import StageAttention
from pp_stage.layers import StageLayers

logger = logging.getLogger(__name__)


@dataclass
class GraphRecord:
    stage_id: int
    bs: int
    graph: torch.cuda.CUDAGraph
    static_hidden: torch.Tensor
    static_residual: torch.Tensor
    static_positions: torch.Tensor
    out_hidden: Optional[torch.Tensor] = None
    out_residual: Optional[torch.Tensor] = None


class StageGraphRunner:
    """Captures this stage's layers for every decode bucket and replays them per microbatch."""

    def __init__(self, cfg: PipelineConfig, spec: StageSpec, layers: StageLayers, attn: StageAttention, device):
        self.cfg = cfg
        self.stage_id = spec.stage_id
        self.layers = layers
        self.attn = attn
        self.device = torch.device(device)
        self.buckets: List[int] = usable_buckets(cfg.graph_buckets, cfg.microbatch_size)
        self.records: Dict[Tuple[int, int], GraphRecord] = {}
        self.pool = None

    def bucket_for(self, bs: int) -> Optional[int]:
        for b in self.buckets:
            if b >= bs:
                return b
        return None

    def has(self, bs: int) -> bool:
        return (self.stage_id, bs) in self.records

    def _dummy_microbatch(self, bs: int) -> Microbatch:
        # one token per row, every row holding one cached token on page 0
        ps = self.cfg.page_size
        ar = np.arange(bs + 1, dtype=np.int32)
        ones = np.ones(bs, dtype=np.int32)
        host = lambda a: torch.from_numpy(a).pin_memory()  # noqa: E731
        zeros_i32 = torch.zeros(bs, dtype=torch.int32, device=self.device)
        zeros_i64 = torch.zeros(bs, dtype=torch.int64, device=self.device)
        return Microbatch(
            mb_id=-1,
            req_ids=list(range(bs)),
            is_prefill=False,
            num_tokens=bs,
            qo_indptr_cpu=host(ar),
            kv_indptr_cpu=host(ar.copy()),
            kv_last_page_len_cpu=host(ones),
            seq_lens_cpu=host(ones.copy()),
            input_ids=zeros_i64,
            positions=zeros_i64.clone(),
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            q_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            kv_indices=zeros_i32,
            block_tables=torch.zeros(bs, 1, dtype=torch.int32, device=self.device),
            slot_pages=zeros_i64.clone(),
            slot_offsets=torch.full((bs,), ps - 1, dtype=torch.int64, device=self.device),
        )

    def record_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self._record_one(bs)
        torch.cuda.synchronize()
        logger.info("stage %d captured %d decode buckets", self.stage_id, len(self.records))

    def _record_one(self, bs: int) -> None:
        if bucket_capacity(self.attn.graph_wrappers[bs]) != bs:
            raise RuntimeError(f"stage {self.stage_id}: the wrapper for bucket {bs} serves another batch size")
        H = self.cfg.hidden_size
        rec = GraphRecord(
            self.stage_id,
            bs,
            torch.cuda.CUDAGraph(),
            static_hidden=torch.zeros(bs, H, dtype=self.cfg.dtype, device=self.device),
            static_residual=torch.zeros(bs, H, dtype=self.cfg.dtype, device=self.device),
            static_positions=torch.zeros(bs, dtype=torch.int64, device=self.device),
        )
        meta = self.attn.prepare_microbatch(self._dummy_microbatch(bs), bs)

        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                h, _r = self.layers.forward_decode(rec.static_hidden, rec.static_residual, rec.static_positions, meta)
        torch.cuda.current_stream().wait_stream(side)
        peak = h.abs().max().item()  # expect: FC101
        if not math.isfinite(peak):
            raise RuntimeError(f"stage {self.stage_id} bucket {bs}: warm-up produced non-finite activations")

        with torch.cuda.graph(rec.graph, pool=self.pool):
            rec.out_hidden, rec.out_residual = self.layers.forward_decode(
                rec.static_hidden, rec.static_residual, rec.static_positions, meta
            )
        self.records[(self.stage_id, bs)] = rec

    def prepare_replay(self, mb: Microbatch, hidden: torch.Tensor, residual: Optional[torch.Tensor]) -> GraphRecord:
        bs = self.bucket_for(mb.bs)
        rec = self.records[(self.stage_id, bs)]
        n = mb.num_tokens
        self.attn.prepare_microbatch(mb, bs)
        # padding rows carry no pages, but the kernel still reads their last-page length
        self.attn.last_page_len[mb.bs: bs] = 1  # expect: FC104
        rec.static_positions[:n].copy_(mb.positions, non_blocking=True)  # ok: FC104
        rec.static_hidden[:n].copy_(hidden)
        if residual is None:
            rec.static_residual.zero_()
        else:
            # the channel hands out views of its receive buffer, which the next microbatch overwrites
            rec.static_residual = residual.clone()  # expect: FC107
        return rec

    def replay_debug_stats(self) -> Dict[str, List[float]]:
        return {f"{s}/{b}": rec.out_hidden.float().norm(dim=-1).tolist() for (s, b), rec in self.records.items()}  # ok: FC101
