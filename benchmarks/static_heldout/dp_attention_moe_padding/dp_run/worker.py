"""One DP rank: gathers every rank's token count, then steps its own batch or a dummy one."""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from dpmoe import DPConfig, MoEPadPlan, gather_token_counts, gather_token_counts_cpu
from dp_attn.backend import DPAttentionBackend
from dp_attn.meta import LocalBatch, make_step_meta
from dp_run.graph_runner import DPGraphRunner
from dp_run.model import DPModel


class DPWorker:
    def __init__(self, cfg: DPConfig, device: torch.device, dp_group, cpu_group) -> None:
        self.cfg, self.device = cfg, device
        self.dp_group, self.cpu_group = dp_group, cpu_group
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.backend = DPAttentionBackend(cfg, device)
        self.model = DPModel(cfg, self.backend, dp_group, self.kv_caches, device)
        self.graph_runner = DPGraphRunner(self.model, self.backend, cfg, device)
        self.dummy_ids: Optional[torch.Tensor] = None
        self.counts_cpu = torch.zeros(cfg.dp_size, dtype=torch.int32)
        self.last_counts: List[int] = []

    def _slots(self, batch: LocalBatch) -> torch.Tensor:
        lens = batch.seq_lens_cpu.numpy()
        q_lens = batch.query_lens_cpu.numpy()
        slots = [
            p[pos // self.cfg.page_size] * self.cfg.page_size + pos % self.cfg.page_size
            for p, s, q in zip(batch.page_lists, lens, q_lens)
            for pos in range(s - q, s)
        ]
        return torch.from_numpy(np.asarray(slots, dtype=np.int64)).pin_memory().to(self.device, non_blocking=True)

    def run_step(self, batch: Optional[LocalBatch]) -> Optional[torch.Tensor]:
        assert self.dp_group is not None, "DP group not initialised"  # ok: FC109
        n_local = 0 if batch is None else batch.num_tokens
        counts = gather_token_counts(n_local, self.dp_group, self.device)
        self.counts_cpu = torch.zeros(self.cfg.dp_size, dtype=torch.int32)  # ok: FC107
        gather_token_counts_cpu(n_local, self.cpu_group, out=self.counts_cpu)
        plan = MoEPadPlan(counts, self.counts_cpu, self.cfg.dp_size)
        self.model.set_pad_plan(plan)
        self.last_counts = plan.counts_cpu.tolist()  # ok: FC101
        gbs = self.cfg.global_bucket(plan.max_tokens_cpu)
        if batch is None:
            self.run_dummy(gbs)
            return None
        meta = make_step_meta(batch, self.cfg, self.device)
        slots = self._slots(batch)
        if batch.is_decode and gbs > 0 and batch.num_seqs <= self.cfg.max_graph_bs:
            return self.graph_runner.replay(meta, batch.input_ids, slots, gbs)
        self.backend.plan_local(meta)
        return self.model.forward_eager(batch.input_ids, slots)

    def run_dummy(self, gbs: int) -> None:
        """Nothing scheduled here: run one padded row so that the MoE collectives line up."""
        if gbs > 0:
            self.graph_runner.replay_dummy(gbs)
            return
        if self.dummy_ids is None:
            self.dummy_ids = torch.zeros(1, dtype=torch.int64, device=self.device)  # ok: FC107
        self.backend.last_len_buf[:1].fill_(1)  # expect: FC104
        self.backend.plan_dummy(1)
        self.model.forward_eager(self.dummy_ids, self.dummy_ids)
