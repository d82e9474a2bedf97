"""Attention strategies. The runner picks one per step from the registry and stores it in ``runner.strategy``."""

from __future__ import annotations

import abc
import functools
import logging
from typing import Optional

import torch
from flashinfer import MultiLevelCascadeAttentionWrapper, merge_state

from sso.attention.backend import FlashInferBackend
from sso.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class AttentionStrategy(abc.ABC):
    """Strategy interface. ``plan`` runs once per step before the forward, ``forward`` once per layer."""

    name = "base"

    def __init__(self, backend: FlashInferBackend) -> None:
        self.backend = backend
        self._kv_layout = backend.kv_layout
        self._plan_info: Optional[tuple] = None

    @abc.abstractmethod
    def plan(self, batch: ForwardBatch) -> None: ...

    @abc.abstractmethod
    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: ForwardBatch, k=None, v=None) -> torch.Tensor: ...

    def describe(self) -> str:
        return f"{self.name}[{self._kv_layout}]"  # ok: FC103

    def _remember(self, batch: ForwardBatch) -> None:
        # the strategy's own record of the last plan, kept so an identical step can skip re-planning
        self._plan_info = (batch.batch_size, batch.num_tokens)  # ok: FC103


class DecodeStrategy(AttentionStrategy):
    name = "decode"

    def __init__(self, backend: FlashInferBackend) -> None:
        super().__init__(backend)
        self.wrapper = backend.decode_wrapper
        self.graph_wrappers = backend.graph_decode_wrappers
        self.max_len_seen = 0

    def plan(self, batch: ForwardBatch) -> None:
        bs = batch.batch_size
        if batch.use_graph and bs in self.graph_wrappers:
            self._plan_graph(batch)
            return
        if self.wrapper._plan_info is not None and self._plan_info == (bs, batch.num_tokens):  # expect: FC103
            return
        self.max_len_seen = max(self.max_len_seen, int(batch.seq_lens.max()))  # expect: FC101
        indptr = self.backend.kv_indptr[: bs + 1]
        indptr.copy_(batch.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.wrapper.plan(  # expect: FC102
            indptr,
            batch.kv_indices,
            batch.kv_last_page_len_cpu[:bs],
            **self.backend.plan_kwargs(),
        )
        self._remember(batch)

    def _plan_graph(self, batch: ForwardBatch) -> None:
        bs = batch.batch_size
        w = self.graph_wrappers[bs]
        num_pages = int(batch.kv_indptr_cpu[bs])  # ok: FC101
        self.backend.cuda_graph_kv_indices[:num_pages].copy_(batch.kv_indices[:num_pages], non_blocking=True)  # ok: FC104
        w.plan(  # ok: FC102
            batch.kv_indptr_cpu[: bs + 1],
            self.backend.cuda_graph_kv_indices,
            batch.kv_last_page_len_cpu[:bs],
            **self.backend.plan_kwargs(),
        )
        self._remember(batch)

    def forward(self, q, kv_cache, batch, k=None, v=None):
        if not batch.use_graph:
            return self.wrapper.run(q, kv_cache)  # ok: FC108
        bs = batch.batch_size
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.wrapper
        return w.run(q, kv_cache)  # ok: FC108


class PrefillStrategy(AttentionStrategy):
    """Ragged attention over the new tokens, paged attention over the cached prefix, merged."""

    name = "prefill"

    def __init__(self, backend: FlashInferBackend) -> None:
        super().__init__(backend)
        self.ragged = backend.ragged_wrapper
        self.paged = backend.prefill_wrapper
        cfg = backend.cfg
        self._plan_ragged = functools.partial(
            self.ragged.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
        )
        self.max_extend = 0
        self.bos_tokens: Optional[torch.Tensor] = None

    def plan(self, batch: ForwardBatch) -> None:
        bs = batch.batch_size
        if self.paged._kv_layout != self.backend.kv_layout:  # expect: FC103
            raise RuntimeError("prefill wrapper built with another KV layout")
        new_tokens = batch.qo_indptr_cpu[1 : bs + 1] - batch.qo_indptr_cpu[:bs]
        self.max_extend = max(new_tokens.tolist())  # ok: FC101
        num_tokens = int(batch.qo_indptr_cpu[bs])  # ok: FC101
        extend_lens = batch.qo_indptr[1 : bs + 1] - batch.qo_indptr[:bs]
        batch.extras["req_index"] = torch.repeat_interleave(  # ok: FC101
            torch.arange(bs, device=extend_lens.device), extend_lens, output_size=num_tokens
        )
        # first prompt tokens, for the prefix-cache hash
        self.bos_tokens = batch.input_ids[batch.positions == 0]  # expect: FC101
        self._plan_ragged(batch.qo_indptr, batch.qo_indptr, causal=True)  # expect: FC102
        self.paged.plan(  # ok: FC102
            batch.qo_indptr_cpu,
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.kv_last_page_len_cpu,
            causal=False,
            **self.backend.plan_kwargs(),
        )
        self._remember(batch)

    def forward(self, q, kv_cache, batch, k=None, v=None):
        o_new, lse_new = self.ragged.run_return_lse(q, k, v)  # expect: FC108
        o_pre, lse_pre = self.paged.run_return_lse(q, kv_cache)  # expect: FC108
        out, _ = merge_state(o_new, lse_new, o_pre, lse_pre)
        return out


class CascadeStrategy(AttentionStrategy):
    """Two-level cascade: one shared system prompt, then each request's own pages."""

    name = "cascade"
    WORKSPACE_BYTES = 256 << 20

    def __init__(self, backend: FlashInferBackend) -> None:
        super().__init__(backend)
        dev = backend.device
        self.workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.wrapper = MultiLevelCascadeAttentionWrapper(2, self.workspace, backend.kv_layout)
        self.shared_kv_indptr_gpu = torch.zeros(2, dtype=torch.int32, device=dev)
        self.shared_qo_indptr_cpu = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.shared_kv_indptr_cpu = torch.zeros(2, dtype=torch.int32, pin_memory=True)
        self.shared_last_page_len_cpu = torch.ones(1, dtype=torch.int32, pin_memory=True)
        self.shared_indices: Optional[torch.Tensor] = None

    def plan(self, batch: ForwardBatch) -> None:
        bs = batch.batch_size
        if batch.prefix_lens is None or batch.prefix_lens_cpu is None:
            self._plan_flat(batch)
            return
        page = self.backend.cfg.page_size
        shortest = int(batch.prefix_lens_cpu[:bs].min())  # ok: FC101
        shared_len = batch.prefix_lens[0].item()  # expect: FC101
        shared_pages = min(shortest, shared_len) // page
        self.shared_qo_indptr_cpu[1] = int(batch.qo_indptr_cpu[bs])
        self.shared_kv_indptr_cpu[1] = shared_pages
        self.shared_kv_indptr_gpu.copy_(self.shared_kv_indptr_cpu, non_blocking=True)
        self.shared_indices = batch.kv_indices[:shared_pages]
        self.wrapper.plan(  # expect: FC102
            [self.shared_qo_indptr_cpu, batch.qo_indptr_cpu],
            [self.shared_kv_indptr_gpu, batch.kv_indptr_cpu],
            [self.shared_indices, batch.kv_indices],
            [self.shared_last_page_len_cpu, batch.kv_last_page_len_cpu],
            **self.backend.plan_kwargs(),
        )
        self._remember(batch)

    def _plan_flat(self, batch: ForwardBatch) -> None:
        kw = dict(
            qo_indptr=batch.qo_indptr_cpu,
            paged_kv_indptr=batch.kv_indptr_cpu,
            paged_kv_indices=batch.kv_indices,
            paged_kv_last_page_len=batch.kv_last_page_len_cpu,
            causal=True,
        )
        kw.update(self.backend.plan_kwargs())
        self.backend.prefill_wrapper.plan(**kw)  # ok: FC102

    def forward(self, q, kv_cache, batch, k=None, v=None):
        bs = batch.batch_size
        if batch.prefix_lens is not None:
            # unique-level lengths reuse the decode graphs' indptr storage instead of a fresh tensor
            unique_lens = batch.seq_lens[:bs] - batch.prefix_lens[:bs]
            torch.cumsum(unique_lens, 0, out=self.backend.cuda_graph_kv_indptr[1 : bs + 1])  # expect: FC104
        return self.wrapper.run(q, kv_cache)  # expect: FC108


class NullStrategy(AttentionStrategy):
    """Null object for idle (DP-padding) steps: plans nothing, attends to nothing."""

    name = "null"

    def __init__(self, backend: FlashInferBackend) -> None:
        super().__init__(backend)
        # built per idle step; nothing captured reads it
        self.empty_out = torch.zeros(0, backend.cfg.num_qo_heads, backend.cfg.head_dim, device=backend.device)  # ok: FC107

    def plan(self, batch: ForwardBatch) -> None:
        return None

    def forward(self, q, kv_cache, batch, k=None, v=None):
        return torch.zeros_like(q)
