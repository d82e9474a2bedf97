"""Plan pool: FlashInfer plan() calls run on worker threads while the GPU runs the previous step."""
import functools
import logging
import operator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, List

import torch
from flashinfer.decode import fast_decode_plan

from engine.attention import FlashInferAttention
from poolserve import DECODE_BUCKETS, HostPlan, PlanTicket

logger = logging.getLogger(__name__)


class PlanPool:
    def __init__(self, attn: FlashInferAttention, workers: int):
        assert workers > 0, "the plan pool needs at least one worker"  # expect: FC109
        self.attn, self.cfg = attn, attn.cfg
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fi-plan")
        self.pages_planned: Dict[int, int] = {}
        self.plan_cache: Dict[int, object] = {}
        self.stats_cpu = torch.zeros(attn.cfg.max_batch_size + 1, dtype=torch.int32)
        self.last_indptr = None
        self._closed = False

    def submit_step(self, ticket: PlanTicket) -> List[Future]:
        plan = ticket.plan
        assert plan.bucket in self.attn.graph_wrappers, f"no graph for bucket {plan.bucket}"  # expect: FC109
        ticket.scratch = torch.empty(plan.bucket, self.cfg.vocab_size, device=self.attn.device)  # ok: FC107
        ticket.future = self.pool.submit(self.stage_bucket, plan.bucket, plan)
        ticket.future.add_done_callback(self.on_bucket_ready)
        futures = [ticket.future, self.pool.submit(self._plan_window, plan.bucket, plan)]
        if self.cfg.num_draft_tokens:
            futures.append(self.pool.submit(self._plan_verify, plan))
        return futures

    def submit_eager(self, plan: HostPlan) -> Future:
        return self.pool.submit(self._plan_eager_decode if plan.qo_indptr is None else self._plan_prefill, plan)

    def warm_all(self) -> List[int]:
        return list(self.pool.map(self._warm_bucket, DECODE_BUCKETS))

    def _check_plan(self, bs: int, plan: HostPlan) -> None:
        assert plan.kv_indptr.shape[0] == bs + 1, "host plan was padded for another bucket"  # expect: FC109

    def stage_bucket(self, bs: int, plan: HostPlan) -> int:
        """Upload one bucket's page list and plan its graph-mode wrapper."""
        self._check_plan(bs, plan)
        bufs, w = self.attn.graph_bufs[bs], self.attn.graph_wrappers[bs]
        total = int(plan.kv_indptr[-1])  # ok: FC101
        bufs.indptr_host.copy_(torch.from_numpy(plan.kv_indptr))  # ok: FC101
        bufs.last_page_len_host.copy_(torch.from_numpy(plan.last_page_len))  # ok: FC104
        bufs.kv_indptr.copy_(bufs.indptr_host, non_blocking=True)  # ok: FC104
        bufs.kv_indices[:total].copy_(torch.from_numpy(plan.kv_indices), non_blocking=True)  # ok: FC104
        if (bufs.kv_indptr[1:] < bufs.kv_indptr[:-1]).any():  # expect: FC101
            raise ValueError(f"non-monotone kv_indptr for bucket {bs}: {bufs.kv_indptr}")  # ok: FC101
        w.plan(bufs.indptr_host, bufs.kv_indices, bufs.last_page_len_host, *self.attn.dims)  # ok: FC102
        bufs.last_page_len.copy_(bufs.last_page_len_host, non_blocking=True)  # expect: FC104
        return bs

    def on_bucket_ready(self, fut: Future) -> None:
        """Done-callback, run by the worker that finished `stage_bucket`."""
        assert not self._closed, "plan callback after shutdown"  # ok: FC109
        if fut.exception() is not None:  # ok: FC101
            logger.error("staging failed: %r", fut.exception())
            return
        bs = fut.result()  # ok: FC101
        bufs = self.attn.graph_bufs[bs]
        self.pages_planned[bs] = bufs.kv_indptr[bs].item()  # expect: FC101
        self.stats_cpu[: bs + 1].copy_(bufs.kv_indptr)  # expect: FC101
        self.plan_cache[bs] = self.attn.graph_wrappers[bs]._plan_info  # expect: FC103
        self.last_indptr = bufs.kv_indptr.clone()  # expect: FC107
        bufs.last_page_len.clamp_(min=1)  # expect: FC104

    def _plan_window(self, bs: int, plan: HostPlan) -> int:
        bufs, w = self.attn.graph_bufs[bs], self.attn.window_wrappers[bs]
        total = int(plan.win_indptr[-1])
        bufs.win_indptr_host.copy_(torch.from_numpy(plan.win_indptr))
        bufs.win_indptr.copy_(bufs.win_indptr_host, non_blocking=True)  # ok: FC104
        if bufs.win_indptr[-1] == 0:  # expect: FC101
            return bs
        w.plan(  # expect: FC102
            bufs.win_indptr, bufs.win_indices, bufs.last_page_len_host, *self.attn.dims,
            window_left=self.cfg.sliding_window,
        )
        bufs.win_indices[:total].copy_(torch.from_numpy(plan.win_indices), non_blocking=True)  # expect: FC104
        return bs

    def _plan_verify(self, plan: HostPlan) -> None:
        n, k = plan.batch_size, self.cfg.num_draft_tokens
        qo_indptr = torch.arange(0, (n + 1) * k, k, dtype=torch.int32, device=self.attn.device)
        self.attn.verify.plan(  # expect: FC102
            qo_indptr, torch.from_numpy(plan.kv_indptr[: n + 1]), self.attn.eager_indices,
            torch.from_numpy(plan.last_page_len[:n]), *self.attn.dims, causal=True,
        )

    def _plan_prefill(self, plan: HostPlan) -> None:
        n, attn = plan.batch_size, self.attn
        qo_host = torch.from_numpy(plan.qo_indptr)
        self.attn.qo_indptr = torch.empty(n + 1, dtype=torch.int32, device=attn.device)  # expect: FC107
        attn.qo_indptr.copy_(qo_host, non_blocking=True)  # ok: FC104
        torch.cuda.current_stream().synchronize()  # expect: FC101
        if plan.kv_indptr[n] == 0:  # ok: FC101
            attn.ragged.plan(qo_host, qo_host, *attn.dims[:3], causal=True)  # ok: FC102
            return
        attn.paged_prefill.plan(  # expect: FC102
            attn.qo_indptr, torch.from_numpy(plan.kv_indptr[: n + 1]), attn.prefill_indices,
            torch.from_numpy(plan.last_page_len[:n]), *attn.dims, causal=True,
        )

    def _plan_eager_decode(self, plan: HostPlan) -> None:
        n, attn = plan.batch_size, self.attn
        indptr_host, last_host = torch.from_numpy(plan.kv_indptr[: n + 1]), torch.from_numpy(plan.last_page_len[:n])
        attn.eager_indptr[: n + 1].copy_(indptr_host, non_blocking=True)
        attn.eager_indices[: int(plan.kv_indptr[n])].copy_(torch.from_numpy(plan.kv_indices), non_blocking=True)
        if attn._backend != "trtllm-gen":  # ok: FC103
            fast_decode_plan(  # expect: FC102
                attn.eager_decode, attn.eager_indptr[: n + 1], attn.eager_indices, last_host, *attn.dims
            )
        softcap = functools.partial(attn.softcap_eager.plan, logits_soft_cap=self.cfg.logits_soft_cap)
        softcap(indptr_host, attn.eager_indices, last_host, *attn.dims)  # ok: FC102
        draft_plan = attn.draft_decode.plan
        draft_plan(indptr_host, attn.eager_indices, last_host, *attn.dims)  # ok: FC102
        attn.eager_last_page_len[:n].copy_(last_host, non_blocking=True)  # ok: FC104

    def _warm_bucket(self, bs: int) -> int:
        w = self.attn.graph_wrappers[bs]
        if getattr(w, "_cached_module", None) is not None:  # expect: FC103
            return bs
        dev, bufs = self.attn.device, self.attn.graph_bufs[bs]
        dummy, ones = torch.arange(bs + 1, dtype=torch.int32, device=dev), torch.ones(bs, dtype=torch.int32, device=dev)
        w.plan(dummy, bufs.kv_indices, ones, *self.attn.dims)  # expect: FC102
        host, ones_host = torch.arange(bs + 1, dtype=torch.int32), torch.ones(bs, dtype=torch.int32)
        self.attn.window_wrappers[bs].plan(host, bufs.win_indices, ones_host, *self.attn.dims)  # ok: FC102
        return bs

    def stats(self) -> List[int]:
        int_ws = map(operator.attrgetter("_int_workspace_buffer"), self.attn.graph_wrappers.values())  # expect: FC103
        return [t.numel() for t in int_ws]
