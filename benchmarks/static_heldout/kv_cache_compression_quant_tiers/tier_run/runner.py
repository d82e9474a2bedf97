import logging
from typing import Dict, List, Optional

import numpy as np
import torch

from kvtiers import TierConfig
from tier_attn.attention import TieredAttention
from tier_attn.meta import TierStepMeta

from .model import TierModel

logger = logging.getLogger(__name__)


class TierGraphRunner:
    def __init__(self, cfg: TierConfig, model: TierModel, attn: TieredAttention, kv: List[List[torch.Tensor]]):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.kv = kv
        self.copy_stream = torch.cuda.Stream()
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.static_tokens = torch.zeros(cfg.max_batch, dtype=torch.int64, device=attn.device)
        self.static_tier_ids: Optional[torch.Tensor] = None
        self.tier_ids_cpu = torch.zeros(cfg.max_batch, dtype=torch.int8, pin_memory=True)

    def _dummy_meta(self, bs: int) -> TierStepMeta:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        ones = torch.ones(bs, dtype=torch.int32)
        zeros = torch.zeros(bs, dtype=torch.int32, device=self.attn.device)
        return TierStepMeta(
            batch=bs, bf16_indptr_host=indptr, bf16_indices=zeros, bf16_last_page_len_host=ones,
            fp8_indptr_host=torch.zeros(bs + 1, dtype=torch.int32), fp8_indices=zeros[:0],
            fp8_last_page_len=ones, int4_indptr_host=torch.zeros(bs + 1, dtype=torch.int32),
            int4_indices=zeros[:0], int4_last_page_len_host=ones,
            tier_ids=torch.zeros(bs, dtype=torch.int8, device=self.attn.device), graph_bs=bs,
        )

    def record_buckets(self) -> None:
        self.copy_stream.synchronize()  # ok: FC101
        pool = None
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            meta = self._dummy_meta(bs)
            self.attn.prepare_tiers(meta)
            tokens = self.static_tokens[:bs]
            self.model(tokens, self.kv, meta)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.outputs[bs] = self.model(tokens, self.kv, meta)
            pool = g.pool()
            self.graphs[bs] = g

    def prepare_replay(self, meta: TierStepMeta, tokens: torch.Tensor) -> torch.Tensor:
        bs = meta.graph_bs
        self.attn.prepare_tiers(meta)
        self.static_tokens[: meta.batch].copy_(tokens, non_blocking=True)
        self.static_tier_ids = meta.tier_ids.clone()  # expect: FC107
        if self.tier_ids_cpu.numel() < meta.batch:
            self.tier_ids_cpu = torch.empty(meta.batch, dtype=torch.int8, pin_memory=True)  # ok: FC107
        self.graphs[bs].replay()
        return self.outputs[bs][: meta.batch]

    def replay_tier_report(self, table_tier: torch.Tensor) -> Dict[str, int]:
        counts = torch.bincount(table_tier.long(), minlength=3).tolist()  # ok: FC101
        return {"bf16": counts[0], "fp8": counts[1], "int4": counts[2], "graphs": int(np.int64(len(self.graphs)))}
