"""The part every assembled backend shares.

Feature mixins come first in the MRO and cooperate through ``super()``: each
``prepare_feature_metadata`` plans what its feature needs and passes the batch on, each
``forward_decode``/``forward_extend`` handles the layers it owns and defers the others. The chain
ends here. Plan variants are ``partialmethod``s of one ``_plan``.
"""

from __future__ import annotations

from functools import partialmethod
from typing import Dict, Optional

import numpy as np
import torch

from ..buffers import DeviceBuffer, PinnedMirror
from ..config import EngineConfig
from ..forward_batch import ForwardBatch, StepMetadata
from ..kv_pool import PagedKVPool


class AttentionBackendBase:
    # overridden by feature mixins or by the factory's class namespace
    decode_backend = "auto"
    use_tensor_cores = False
    decode_via_prefill = False
    num_draft_tokens = 0

    # paged-KV layout of the current step: device buffers (graph wrappers bind them) and the pinned
    # mirrors the host fills and plan() reads
    kv_indptr = DeviceBuffer("max_bs", extra=1)
    kv_indices = DeviceBuffer("max_kv_indices")
    kv_last_page_len = DeviceBuffer("max_bs")
    kv_indptr_host = PinnedMirror("max_bs", extra=1)
    kv_indices_host = PinnedMirror("max_kv_indices")
    kv_last_page_len_host = PinnedMirror("max_bs", fill=1)
    qo_indptr_host = PinnedMirror("max_bs", extra=1)

    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool) -> None:
        self.cfg = cfg
        self.kv_pool = kv_pool
        self.device = torch.device(cfg.device)
        self.dtype = cfg.dtype
        self.kv_dtype = cfg.dtype
        self.num_q_heads = cfg.num_q_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.page_size = cfg.page_size
        self.max_bs = cfg.max_batch_size
        self.max_num_tokens = cfg.max_num_tokens
        self.max_context_len = cfg.max_context_len
        self.max_pages_per_seq = cfg.max_pages_per_seq
        # index capacity for a typical mix of lengths; _ensure_index_capacity handles outliers
        self.max_kv_indices = cfg.max_batch_size * cfg.max_pages_per_seq // 4
        self.window_left = -1
        self._kv_layout = cfg.kv_layout
        # shared by the prefill wrappers; zeroed so a trtllm-gen wrapper may use it as well
        self.float_workspace = torch.zeros(cfg.float_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.wrappers: Dict[str, object] = {}
        self._plan_info: Dict[str, tuple] = {}
        self.forward_metadata: Optional[StepMetadata] = None
        self._run_feature_inits()
        self._check_buffers()

    # ------------------------------------------------------------------ set-up
    def _run_feature_inits(self) -> None:
        # every mixin names its set-up ``feature_init``; run them base-first
        for klass in reversed(type(self).__mro__):
            init = klass.__dict__.get("feature_init")
            if init is not None:
                init(self)

    def _check_buffers(self) -> None:
        assert self.kv_indptr.numel() == self.max_bs + 1  # ok: FC109
        assert self.kv_last_page_len_host.numel() == self.max_bs

    # ------------------------------------------------------------------ per step
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.forward_metadata = StepMetadata(batch.mode, batch.batch_size)
        self.prepare_feature_metadata(batch)

    def prepare_feature_metadata(self, batch: ForwardBatch) -> None:
        """End of the cooperative chain: nothing left to plan."""

    def forward(self, q, k, v, layer, batch: ForwardBatch) -> torch.Tensor:
        self.kv_pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v)
        q = q.view(-1, self.num_q_heads, self.head_dim)
        if batch.mode.is_decode():
            o = self.forward_decode(q, layer, batch)
        else:
            o = self.forward_extend(q, k, v, layer, batch)
        return o.view(-1, self.num_q_heads * self.head_dim)

    def forward_decode(self, q, layer, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} was assembled without a decode feature")

    def forward_extend(self, q, k, v, layer, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} was assembled without a prefill feature")

    # ------------------------------------------------------------------ host mirrors
    def _ensure_index_capacity(self, total: int) -> None:
        if total <= self.kv_indices_host.numel():
            return
        # a batch with more pages than the typical mix: grow the mirror and the device index list
        new_cap = max(total, 2 * self.kv_indices_host.numel())
        self.kv_indices_host = torch.zeros(new_cap, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.kv_indices = torch.zeros(new_cap, dtype=torch.int32, device=self.device)  # expect: FC107

    def _fill_decode_mirrors(self, batch: ForwardBatch, pad_to: Optional[int] = None) -> int:
        bs = batch.batch_size
        n = pad_to or bs
        ps = self.page_size
        lens = batch.seq_lens_cpu[:bs].numpy()
        num_pages = (lens + ps - 1) // ps
        indptr = self.kv_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum(num_pages, out=indptr[1 : bs + 1])
        indptr[bs + 1 : n + 1] = indptr[bs]
        total = int(indptr[bs])  # ok: FC101
        self._ensure_index_capacity(total)
        indices = self.kv_indices_host.numpy()
        for i in range(bs):
            indices[indptr[i] : indptr[i + 1]] = batch.page_table_cpu[i, : num_pages[i]]
        last = self.kv_last_page_len_host.numpy()
        last[:bs] = lens - (num_pages - 1) * ps
        last[bs:n] = 1
        return total

    def _fill_prefill_mirrors(self, batch: ForwardBatch) -> int:
        bs = batch.batch_size
        self.qo_indptr_host[: bs + 1].copy_(batch.qo_indptr_cpu[: bs + 1])
        return self._fill_decode_mirrors(batch)

    # ------------------------------------------------------------------ planning
    def _plan(self, batch: ForwardBatch, *, phase: str, wrapper=None, pad_to: Optional[int] = None,
              refill: bool = True) -> None:
        bs = batch.batch_size
        n = pad_to or bs
        w = wrapper if wrapper is not None else self.wrappers[phase]
        if phase == "decode":
            if refill:
                total = self._fill_decode_mirrors(batch, pad_to=n)
            else:
                total = int(self.kv_indptr_host[n])  # ok: FC101
            w.plan(  # ok: FC102
                self.kv_indptr_host[: n + 1],
                self.kv_indices_host[:total],
                self.kv_last_page_len_host[:n],
                self.num_q_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                window_left=self.window_left,
                q_data_type=self.dtype,
                kv_data_type=self.kv_dtype,
            )
        elif phase == "prefill":
            total = self._fill_prefill_mirrors(batch)
            w.plan(  # expect: FC102
                batch.qo_indptr,
                self.kv_indptr_host[: bs + 1],
                self.kv_indices_host[:total],
                self.kv_last_page_len_host[:bs],
                self.num_q_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                q_data_type=self.dtype,
                kv_data_type=self.kv_dtype,
            )
        elif phase == "verify":
            total = self._fill_decode_mirrors(batch)
            k = self.num_draft_tokens + 1
            qo_indptr = torch.arange(0, (bs + 1) * k, k, dtype=torch.int32, device=self.device)
            w.plan(  # expect: FC102
                qo_indptr,
                self.kv_indptr_host[: bs + 1],
                self.kv_indices_host[:total],
                self.kv_last_page_len_host[:bs],
                self.num_q_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                q_data_type=self.dtype,
            )
        elif phase == "ragged":
            self.qo_indptr_host[: bs + 1].copy_(batch.qo_indptr_cpu[: bs + 1])
            num_qo = int(self.qo_indptr_host[bs])  # ok: FC101
            if num_qo > self.max_num_tokens:
                raise ValueError(f"{num_qo} tokens exceed max_num_tokens={self.max_num_tokens}")
            w.plan(  # ok: FC102
                self.qo_indptr_host[: bs + 1],
                self.qo_indptr_host[: bs + 1],
                self.num_q_heads,
                self.num_kv_heads,
                self.head_dim,
                causal=True,
                q_data_type=self.dtype,
            )
        else:
            raise ValueError(f"unknown plan phase {phase!r}")
        self._plan_info[phase] = (n, batch.num_tokens)  # ok: FC103

    plan_decode = partialmethod(_plan, phase="decode")
    plan_prefill = partialmethod(_plan, phase="prefill")
    plan_verify = partialmethod(_plan, phase="verify")
    plan_ragged = partialmethod(_plan, phase="ragged")
