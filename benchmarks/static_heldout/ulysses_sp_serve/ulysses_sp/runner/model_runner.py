"""One SP rank's model runner: prefill shards through the all-to-all, decode through graphs."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ulysses_sp.attn.backend import UlyssesFlashInferBackend
from ulysses_sp.batch import ForwardBatch, ShardPlan, UlyssesPrefillMeta, build_decode_inputs, build_prefill_meta
from ulysses_sp.comm.seq_all_to_all import SeqAllToAll
from ulysses_sp.config import SPConfig
from ulysses_sp.model import UlyssesLlama
from ulysses_sp.runner.graph_runner import UlyssesGraphRunner

logger = logging.getLogger(__name__)


@dataclass
class SchedulerOutput:
    prefill_shards: list = field(default_factory=list)  # list[ShardPlan]
    prefill_input_ids: Optional[torch.Tensor] = None  # pinned, this rank's token shard
    decode_rids: list = field(default_factory=list)
    decode_input_ids: Optional[torch.Tensor] = None  # pinned
    decode_positions: Optional[torch.Tensor] = None  # pinned
    decode_seq_lens: Optional[np.ndarray] = None
    finished_mask_gpu: Optional[torch.Tensor] = None
    pad_token_id: int = 0


class SPModelRunner:
    def __init__(self, cfg: SPConfig, group, device: torch.device, vocab_size: int):
        self.cfg = cfg
        self.group = group
        self.device = device
        self.backend = UlyssesFlashInferBackend(cfg, device)
        self.a2a = SeqAllToAll(group, cfg.sp_size, cfg.num_heads, cfg.head_dim, device)
        self.model = UlyssesLlama(cfg, self.backend, self.a2a, vocab_size).to(device)
        self.kv_caches = [
            torch.zeros(
                cfg.max_pages, 2, cfg.page_size, cfg.local_kv_heads, cfg.head_dim,
                dtype=torch.bfloat16, device=device,
            )
            for _ in range(cfg.num_layers)
        ]
        self.backend.init_cuda_graph_state()
        self.graph_runner = UlyssesGraphRunner(self.model, self.backend, cfg, self.kv_caches, device)
        self._count_buf = torch.zeros(cfg.sp_size, dtype=torch.int32, device=device)
        self.page_tables: dict[int, np.ndarray] = {}
        self.new_pages: dict[int, np.ndarray] = {}

    def warm_up_graphs(self) -> None:
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.graph_runner.record_bucket(bs)
        for bs, q_len in self.cfg.extend_buckets:
            self.graph_runner.record_extend(bs, q_len)

    def _bucket_for(self, n: int) -> Optional[int]:
        for bs in self.cfg.graph_buckets:
            if bs >= n:
                return bs
        return None

    # ---------------------------------------------------------------- per step
    def step(self, sched: SchedulerOutput) -> Optional[torch.Tensor]:
        if sched.prefill_shards:
            self._run_prefill(sched)
        if sched.decode_rids:
            return self._run_decode(sched)
        return None

    def _stage_new_pages(self, meta: UlyssesPrefillMeta) -> torch.Tensor:
        # the decode graphs' index buffer is idle while a prefill runs: borrow it instead of allocating
        staging = self.backend.kv_indices[: meta.num_new_pages]
        staging.copy_(meta.new_page_ids, non_blocking=True)  # expect: FC104
        return staging

    def _run_prefill(self, sched: SchedulerOutput) -> torch.Tensor:
        meta = build_prefill_meta(sched.prefill_shards, self.page_tables, self.new_pages, self.cfg, self.device)
        meta.new_page_ids = self._stage_new_pages(meta)
        self.backend.plan_prefill(meta)
        ids = sched.prefill_input_ids.to(self.device, non_blocking=True)
        return self.model.forward_prefill(ids, self.kv_caches, meta)

    def _exchange_decode_counts(self, local_n: int) -> list:
        mine = torch.full((1,), local_n, dtype=torch.int32, device=self.device)
        dist.all_gather_into_tensor(self._count_buf, mine, group=self.group)
        logger.debug("decode rows per SP rank: %s", self._count_buf)  # ok: FC101
        return self._count_buf.tolist()  # expect: FC101

    def _run_decode(self, sched: SchedulerOutput) -> torch.Tensor:
        counts = self._exchange_decode_counts(len(sched.decode_rids))
        padded = max(counts)
        dec = build_decode_inputs(sched.decode_rids, sched.decode_seq_lens, self.page_tables, self.cfg, self.device)
        n = dec.num_reqs
        input_ids = sched.decode_input_ids.to(self.device, non_blocking=True)
        positions = sched.decode_positions.to(self.device, non_blocking=True)
        batch_indices = torch.arange(n, dtype=torch.int32, device=self.device)
        bs = self._bucket_for(padded)
        if bs is None:
            self.backend.plan_decode(dec)
            fb = ForwardBatch(
                batch_size=n,
                input_ids=input_ids,
                positions=positions,
                batch_indices=batch_indices,
                kv_indptr=dec.kv_indptr_cpu.to(self.device, non_blocking=True),
                kv_indices=dec.kv_indices,
                kv_last_page_len=dec.last_page_len,
                decode_wrapper=self.backend.decode_wrapper,
            )
            logits = self.model.forward_decode(input_ids, self.kv_caches, fb)
        else:
            self.backend.prepare_decode_replay(bs, dec)
            fb = ForwardBatch(
                batch_size=n,
                input_ids=input_ids,
                positions=positions,
                batch_indices=batch_indices,
                kv_indptr=self.backend.kv_indptr[: bs + 1],
                kv_indices=self.backend.kv_indices,
                kv_last_page_len=self.backend.kv_last_page_len[:bs],
                decode_wrapper=self.backend.graph_wrappers[bs],
            )
            logits = self.graph_runner.replay(bs, fb)
        next_ids = logits.argmax(dim=-1)
        return torch.where(sched.finished_mask_gpu, sched.pad_token_id, next_ids)  # ok: FC101
