"""The model runner: one ``execute_step`` per scheduler step.

Everything that crosses a function boundary here is a loose record: the scheduler's decision (a
namespace), the forward batch (``build_forward_batch``), the attention metadata the backend returns
and the step output.  Helpers take ``**kwargs`` and forward them on.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, Mapping

import torch

from nsattn.flashinfer_backend import FlashInferBackend
from nsserve.batch import build_forward_batch
from nsserve.config import load_config, to_namespace
from nsserve.graph_runner import CudaGraphRunner
from nsserve.model import Model
from nsserve.records import as_kwargs, make_record, update_record
from nsserve.sampler import Sampler

logger = logging.getLogger(__name__)


class TokenSlotAllocator:
    """Hands out KV token slots (page * page_size + offset) from a device free list."""

    def __init__(self, num_slots: int, device: torch.device):
        self.free = torch.arange(num_slots, dtype=torch.int64, device=device)
        self.head = 0

    def alloc(self, n: int) -> torch.Tensor:
        out = self.free[self.head : self.head + n]
        self.head += n
        return out

    def release(self, n: int) -> None:
        self.head = max(0, self.head - n)


class ModelRunner:
    def __init__(self, hf_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, num_pages: int = 65536):
        chain = load_config(hf_config, overrides)
        self.cfg = to_namespace(chain)
        cfg = self.cfg
        dev = cfg.device
        self.model = Model(cfg).to(device=dev, dtype=cfg.torch_dtype)
        self.attn_backend = FlashInferBackend(cfg, self)
        kv_shape = (num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(kv_shape, dtype=cfg.torch_dtype, device=dev), torch.zeros(kv_shape, dtype=cfg.torch_dtype, device=dev))
            for _ in range(cfg.num_layers)
        ]
        self.model.bind(self.attn_backend, self.kv_caches)
        slots = TokenSlotAllocator(num_pages * cfg.page_size, dev)
        self.pools = SimpleNamespace(
            req_to_page=torch.zeros(cfg.max_batch_size * 4, cfg.max_pages_per_req, dtype=torch.int32, device=dev),
            alloc_token_slots=slots.alloc,
            release_token_slots=slots.release,
        )
        self.sampler = Sampler(cfg)
        self.trtllm_path = self.attn_backend.trtllm
        self.graph_runner = CudaGraphRunner(self) if cfg.enable_cuda_graph and cfg.graph_batch_sizes else None
        self.spec_stats: dict[int, int] = {}
        self.last_step_summary = ""
        self.finished_slots: list[torch.Tensor] = []

    def warmup(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.record_all()

    # ------------------------------------------------------------------ the step
    def execute_step(self, sched: SimpleNamespace) -> SimpleNamespace:
        assert len(sched.req_ids) > 0, "the scheduler sent an empty step"  # expect: FC109
        step = build_forward_batch(sched, self.pools, self.cfg.device, self.cfg.page_size)
        self._trace_step(**vars(step))
        bs = self._bucket_for(step.batch_size) if step.is_decode else None
        if bs is not None:
            torch.cuda.current_stream().wait_stream(self.graph_runner.streams.h2d)
            if self.trtllm_path is not None:
                meta = self.trtllm_path.refresh_bucket(bs, step)
                self.attn_backend.plan_aux(meta)
            else:
                meta = self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, step)
            logits = self.graph_runner.replay(bs, step, meta)
        else:
            meta = self.attn_backend.init_forward_metadata(step)
            hidden = self.model(step.input_ids, step.positions, meta)
            logits = self.model.compute_logits(self._last_token_hidden(hidden, meta))
        fields = self._sampling_fields(sched)
        next_tokens = self.sampler.sample(logits, meta, fields)
        draft_tokens = getattr(sched, "draft_tokens", None)
        if draft_tokens is not None:
            # Hit rate of last step's MTP proposals: one draft token per request.
            prev = torch.as_tensor(draft_tokens, dtype=torch.int64).pin_memory().to(self.cfg.device, non_blocking=True)
            update_record(meta, accept_lens=(next_tokens == prev).to(torch.int32))
        self.advance_after_sample(meta, next_tokens)
        return make_record(
            mode="output",
            batch_size=step.batch_size,
            req_ids=step.req_ids,
            next_tokens=next_tokens,
            **as_kwargs(meta, keep=("logprobs", "draft_logits")),
        )

    def _bucket_for(self, n: int) -> int | None:
        if self.graph_runner is None:
            return None
        return next((b for b in self.graph_runner.buckets if b >= n), None)

    def _last_token_hidden(self, hidden: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        if meta.is_decode:
            return hidden
        # last token of each request: qo_indptr[1:] - 1, gathered on the device
        return hidden.index_select(0, (meta.qo_indptr[1:] - 1).long())

    def _trace_step(self, **kw: Any) -> None:
        logger.debug("step %s bs=%d seq_lens=%s", kw["mode"], kw["batch_size"], kw["seq_lens"])  # ok: FC101
        ids = kw["req_ids_np"].tolist()  # ok: FC101
        # Kept for the /debug/last_step endpoint.
        self.last_step_summary = f"mode={kw['mode']} reqs={ids[:8]} seq_lens={kw['seq_lens']}"  # expect: FC101

    def _sampling_fields(self, sched: SimpleNamespace) -> dict[str, torch.Tensor]:
        dev = self.cfg.device
        temps = torch.tensor(sched.temperatures, dtype=torch.float32).pin_memory()
        top_k = torch.tensor(sched.top_ks, dtype=torch.int32).pin_memory()
        top_p = torch.tensor(sched.top_ps, dtype=torch.float32).pin_memory()
        min_left = torch.tensor(sched.min_tokens_left, dtype=torch.int32).pin_memory()
        return {
            "temperatures": temps.to(dev, non_blocking=True),
            "top_k": top_k.to(dev, non_blocking=True),
            "top_k_cpu": top_k,
            "top_p": top_p.to(dev, non_blocking=True),
            "top_p_cpu": top_p,
            "min_tokens_left": min_left.to(dev, non_blocking=True),
        }

    # ------------------------------------------------------------------ after sampling
    def advance_after_sample(self, step: SimpleNamespace, next_tokens: torch.Tensor) -> None:
        n = step.batch_size
        done = next_tokens == self.cfg.eos_token_id
        finished = step.req_pool_indices[done]  # expect: FC101
        self.finished_slots.append(finished)
        accepted = vars(step).get("accept_lens")
        if accepted is not None:
            for rid, k in zip(step.req_ids, accepted.tolist()):  # expect: FC101
                self.spec_stats[rid] = self.spec_stats.get(rid, 0) + k
        if step.is_decode:
            step.seq_lens_cpu[:n] += 1
            # Keep the device copy current for the next step's kernels (wraps at the page size).
            lpl = step.kv_last_page_len[:n]
            lpl.remainder_(self.cfg.page_size).add_(1)  # expect: FC104

    # ------------------------------------------------------------------ KV maintenance
    def on_pages_moved(self, old_to_new: torch.Tensor) -> None:
        """Remap page ids after the KV allocator compacted the cache (called by the scheduler)."""
        table = self.pools.req_to_page
        table.copy_(old_to_new[table.long()].to(torch.int32))
        bufs = self.attn_backend.graph_bufs
        if bufs is not None:
            idx = bufs.kv_indices
            idx.copy_(old_to_new[idx.long()].to(torch.int32))  # expect: FC104
