"""Start-up memory profiler: a baseline, one prefill at the largest token budget and one decode pass at the largest
batch, then what is left of ``gpu_memory_utilization`` becomes KV pages and a graph budget."""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Callable, List, Tuple

import numpy as np
import torch

from memprof.limits import EngineLimits, KVSizing

if TYPE_CHECKING:
    from memprof.kv_pool import PagedKVPool
    from memprof_rt.attn_backend import FlashInferBackend

logger = logging.getLogger(__name__)


class MemoryProfiler:
    def __init__(self, limits: EngineLimits, gpu_memory_utilization: float, device: torch.device | str) -> None:
        assert 0.0 < gpu_memory_utilization <= 1.0, "gpu_memory_utilization must lie in (0, 1]"  # expect: FC109
        self.limits = limits
        self.util = gpu_memory_utilization
        self.device = torch.device(device)
        self._baseline_free = 0
        self._total = 0
        self._weights_bytes = 0
        self.samples: List[Tuple[str, int]] = []

    # ------------------------------------------------------------ snapshots

    def snapshot_baseline(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        self._baseline_free = free
        self._total = total
        logger.info("baseline: %.2f GiB free of %.2f GiB", free / 2**30, total / 2**30)

    def record_weights(self, model: torch.nn.Module) -> None:
        self._weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self._weights_bytes += sum(b.numel() * b.element_size() for b in model.buffers())
        self.samples.append(("weights", self._weights_bytes))

    # ------------------------------------------------------------- profiling

    def profile_forward(self, run_max_batch: Callable[[], torch.Tensor]) -> int:
        """Peak bytes the largest prefill allocates beyond what is already resident."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        out = run_max_batch()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del out
        gc.collect()
        torch.cuda.empty_cache()
        self.samples.append(("prefill_peak", peak))
        return peak

    def profile_decode(self, backend: "FlashInferBackend", pool: "PagedKVPool") -> int:
        """One decode attention pass at the largest batch over every page of the provisional pool."""
        lim = self.limits
        bs = lim.max_num_seqs
        pages_per_seq = max(1, (pool.num_pages - 1) // bs)
        n = bs * pages_per_seq
        indptr_host = torch.arange(0, n + 1, pages_per_seq, dtype=torch.int32)
        last_host = torch.full((bs,), lim.page_size, dtype=torch.int32)
        # the index buffer is sized for the largest batch already; reuse it instead of allocating a second one
        idx = backend.kv_indices_buf[:n]
        idx.copy_(torch.arange(1, n + 1, dtype=torch.int32, device=self.device))  # expect: FC104
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        backend.eager_decode.plan(  # ok: FC102
            indptr_host,
            idx,
            last_host,
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            q_data_type=pool.dtype,
            kv_data_type=pool.dtype,
        )
        q = torch.randn(bs, lim.num_qo_heads, lim.head_dim, dtype=pool.dtype, device=self.device)
        out = backend.eager_decode.run(q, pool.layer(0))
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        worst = out.abs().amax().item()  # ok: FC101
        if not np.isfinite(worst):
            raise RuntimeError("decode profile produced non-finite attention output; check the KV dtype")
        self.samples.append(("decode_peak", peak))
        return peak

    def account_wrapper_buffers(self, backend: "FlashInferBackend") -> int:
        """Bytes the bucket wrappers keep besides the shared float workspace (for the start-up report)."""
        total = 0
        for w in backend.decode_wrappers.values():
            total += w._int_workspace_buffer.numel()  # expect: FC103
        self.samples.append(("wrapper_int_workspaces", total))
        return total

    # ---------------------------------------------------------------- sizing

    def _graph_budget(self, num_buckets: int) -> int:
        lim = self.limits
        # static logits of the largest bucket plus per-graph bookkeeping in the shared pool
        logits = lim.max_num_seqs * lim.vocab_size * 4
        hidden = lim.max_num_seqs * lim.hidden_size * 2 * 4
        return logits + hidden + num_buckets * (6 << 20)

    def derive_sizing(self, peak_activation: int, workspace_bytes: int, num_buckets: int) -> KVSizing:
        lim = self.limits
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        used_by_us = self._baseline_free - free
        non_torch = max(0, used_by_us - reserved)
        others = total - self._baseline_free
        usable = int(total * self.util) - others
        graph_budget = self._graph_budget(num_buckets)
        kv_bytes = usable - reserved - non_torch - peak_activation - graph_budget
        num_pages = kv_bytes // lim.kv_bytes_per_page
        if num_pages < lim.max_pages_per_seq + 1:
            raise RuntimeError(
                f"only {num_pages} KV pages fit ({kv_bytes / 2**30:.2f} GiB after a peak of "
                f"{peak_activation / 2**30:.2f} GiB); one sequence of max_model_len={lim.max_model_len} needs "
                f"{lim.max_pages_per_seq + 1}. Raise gpu_memory_utilization or lower max_num_batched_tokens."
            )
        sizing = KVSizing(
            num_pages=int(num_pages),
            kv_bytes=int(num_pages * lim.kv_bytes_per_page),
            graph_budget_bytes=graph_budget,
            peak_activation_bytes=peak_activation,
            non_torch_bytes=non_torch,
            workspace_bytes=workspace_bytes,
        )
        sizing.notes.extend(f"{name}={value}" for name, value in self.samples)
        return sizing
