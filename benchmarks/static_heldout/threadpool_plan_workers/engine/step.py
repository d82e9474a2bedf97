"""The step loop: drain the planner's queue, wait on the plan pool's futures, replay or run eagerly."""
import logging
from typing import Dict

import torch
from flashinfer import trtllm_batch_decode_with_kv_cache

from engine.attention import FlashInferAttention
from engine.graph_runner import DecodeGraphRunner
from engine.model import DecodeModel
from poolserve import PlanTicket, StepBatch
from workers.host_planner import HostPlanner
from workers.plan_pool import PlanPool

logger = logging.getLogger(__name__)


class StepExecutor:
    def __init__(self, model: DecodeModel, runner: DecodeGraphRunner, planner: HostPlanner, pool: PlanPool):
        self.model, self.runner, self.planner, self.pool = model, runner, planner, pool
        self.attn: FlashInferAttention = model.attn
        self.cfg = model.cfg
        self.inflight: Dict[int, StepBatch] = {}
        self.h2d_done = torch.cuda.Event()
        self.d2h_done = torch.cuda.Event()
        self.sampled = self.tokens_cpu = None

    def schedule(self, batch: StepBatch) -> None:
        self.inflight[batch.step_id] = batch
        self.planner.submit(batch)

    def step(self) -> torch.Tensor:
        plan = self.planner.out.get()
        batch = self.inflight.pop(plan.step_id)
        assert plan.batch_size == batch.batch_size, "planner and scheduler disagree on the batch"  # ok: FC109
        torch.cuda.current_stream().wait_event(self.h2d_done)  # ok: FC101
        if (batch.positions >= self.cfg.max_model_len - 1).any():  # expect: FC101
            raise RuntimeError("a request reached max_model_len without being finished")
        longest = int(batch.seq_lens_cpu.max())  # ok: FC101
        if batch.is_decode and plan.bucket in self.attn.graph_wrappers and longest <= self.cfg.max_model_len:
            if not vars(self.attn.graph_wrappers[plan.bucket])["_use_cuda_graph"]:  # expect: FC103
                raise RuntimeError(f"bucket {plan.bucket} lost its graph-mode wrapper")
            for fut in self.pool.submit_step(PlanTicket(batch, plan)):
                fut.result()
            logits = self.runner.replay(batch, plan.bucket)
        else:
            self.pool.submit_eager(plan).result()
            no_prefix = bool(plan.kv_indptr[batch.batch_size] == 0)
            logits = self.model.forward_eager(batch) if batch.is_decode else self.model.forward_extend(batch, no_prefix)
        self.sampled = torch.empty(batch.batch_size, dtype=torch.int64, device=self.attn.device)  # expect: FC107
        torch.argmax(logits[: batch.batch_size], dim=-1, out=self.sampled)
        self.tokens_cpu = torch.empty(batch.batch_size, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.tokens_cpu.copy_(self.sampled, non_blocking=True)  # ok: FC101
        self.d2h_done.record()
        logger.debug("step %d sampled %s", batch.step_id, self.sampled.tolist())  # expect: FC101
        return self.tokens_cpu

    def compact(self, remap: torch.Tensor) -> None:
        # after page defragmentation: rewrite every page id through `remap` (old id -> new id)
        self.attn.eager_indices.copy_(remap[self.attn.eager_indices.long()])  # ok: FC104
        for bufs in self.attn.graph_bufs.values():
            bufs.kv_indices.copy_(remap[bufs.kv_indices.long()])  # expect: FC104

    def abort_all(self) -> None:
        for bufs in self.attn.graph_bufs.values():
            bufs.win_indptr.zero_()  # expect: FC104
        self.inflight.clear()

    def warmup(self) -> None:
        """One eager single-row step through the planner and the pool, so every JIT module exists."""
        self.pool.warm_all()
        dev, one_cpu = self.attn.device, torch.ones(1, dtype=torch.int32)
        ids = torch.zeros(1, dtype=torch.int64, device=dev)
        warm = StepBatch(-1, 1, True, ids, ids.clone(), one_cpu.to(dev), one_cpu, ids.clone(), one_cpu.long())
        self.planner.run_once(warm)
        self.pool.submit_eager(self.planner.out.get()).result()
        self.model.forward_eager(warm)
        qo = torch.tensor([0, 4], dtype=torch.int32)
        self.attn.ragged.plan(qo, qo, *self.attn.dims[:3], causal=True)  # ok: FC102
        if self.cfg.decode_backend == "trtllm-gen":
            ws = torch.empty(self.cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC105
            ws.fill_(0)
            q = torch.zeros(1, self.cfg.num_qo_heads, self.cfg.head_dim, dtype=torch.bfloat16, device=dev)
            tables = self.attn.page_table[:1]
            trtllm_batch_decode_with_kv_cache(q, self.model.kv_caches[0], ws, tables, warm.seq_lens, max_seq_len=1)
