"""Decode instance of a PD-disaggregated deployment, with decode context parallelism."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist

from dcp.comm import DCPComm
from dcp.config import DCPConfig
from dcp.shard import ShardPageTable, local_seq_lens
from dcp_srt.backend import DCPFlashInferBackend
from dcp_srt.forward_batch import ForwardBatch
from dcp_srt.graph_runner import CudaGraphRunner
from dcp_srt.model import DCPModel


class ShardKVPool:
    def __init__(self, cfg: DCPConfig, device: torch.device):
        shape = (cfg.num_local_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]


@dataclass
class DecodeReq:
    pool_idx: int
    seq_len: int                      # tokens in the KV after this step
    token_ids: List[int]              # q_len tokens to run


class ModelRunner:
    def __init__(self, cfg: DCPConfig, rank: int, group: Optional[dist.ProcessGroup], device: torch.device):
        self.cfg = cfg
        self.rank = rank
        self.device = device
        self.comm = DCPComm(cfg, rank, group, device)
        self.pages = ShardPageTable(cfg, rank, device)
        self.kv_pool = ShardKVPool(cfg, device)
        self.attn_backend = DCPFlashInferBackend(cfg, self.comm, self.pages, self.kv_pool, device)
        self.model = DCPModel(cfg, self.attn_backend).to(device=device, dtype=torch.bfloat16)
        self.graph_runner = CudaGraphRunner(self) if cfg.enable_graphs else None

    def _owned_slots(self, reqs: List[DecodeReq]) -> np.ndarray:
        """Slot of each new token on this rank, the trash page (slot 0) where another rank owns it."""
        cfg, q = self.cfg, self.cfg.q_len
        out = np.zeros(len(reqs) * q, dtype=np.int64)
        span = cfg.dcp_size * cfg.interleave
        for i, r in enumerate(reqs):
            for j in range(q):
                pos = r.seq_len - q + j
                if (pos // cfg.interleave) % cfg.dcp_size != self.rank:
                    continue
                local_pos = (pos // span) * cfg.interleave + pos % cfg.interleave
                out[i * q + j] = self.pages.slot_of(r.pool_idx, local_pos)
        return out

    def make_batch(self, reqs: List[DecodeReq]) -> ForwardBatch:
        n, q = len(reqs), self.cfg.q_len
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        pool_cpu = torch.tensor([r.pool_idx for r in reqs], dtype=torch.int64)
        local_cpu = local_seq_lens(seq_lens_cpu, self.rank, self.cfg.dcp_size, self.cfg.interleave)
        self.pages.ensure(pool_cpu.tolist(), local_cpu.tolist())
        ids = torch.tensor([t for r in reqs for t in r.token_ids], dtype=torch.int64)
        pos = torch.tensor([r.seq_len - q + j for r in reqs for j in range(q)], dtype=torch.int64)
        return ForwardBatch(
            batch_size=n,
            q_len=q,
            input_ids=ids.to(self.device, non_blocking=True),
            positions=pos.to(self.device, non_blocking=True),
            req_pool_indices=pool_cpu.to(self.device, non_blocking=True),
            req_pool_indices_cpu=pool_cpu,
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=torch.from_numpy(self._owned_slots(reqs)).to(self.device, non_blocking=True),
            qo_indptr_cpu=torch.arange(0, n * q + 1, q, dtype=torch.int32),
        )

    def forward_decode(self, reqs: List[DecodeReq]) -> torch.Tensor:
        fb = self.make_batch(reqs)
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb)
        return logits.argmax(dim=-1)
