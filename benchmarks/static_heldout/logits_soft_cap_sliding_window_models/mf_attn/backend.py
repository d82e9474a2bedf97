"""One attention backend for every family: eager wrappers per family, graph-mode buckets per family."""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from mfserve import FamilySpec, ServeConfig, pad_indptr, pad_last_page_len, window_kv_indptr
from mf_attn.wrappers import (
    FamilyWrapperSet,
    make_alibi_stage,
    make_bucket_wrapper,
    make_family_wrappers,
    plan_kwargs,
)
from mf_attn.workspace import make_graph_workspace, make_prefill_workspace
from mf_runtime.batch import FamilyBatch

logger = logging.getLogger(__name__)


class FamilyBackend:
    def __init__(self, cfg: ServeConfig, specs: List[FamilySpec], device: torch.device):
        self.cfg, self.device = cfg, device
        self._kv_layout = "NHD"  # ok: FC103
        self.specs: Dict[str, FamilySpec] = {}
        self.eager: Dict[str, FamilyWrapperSet] = {}
        self.bucket_wrappers: Dict[str, Dict[int, BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.graph_bufs: Dict[str, Dict[str, torch.Tensor]] = {}
        self.indptr_host: Dict[str, torch.Tensor] = {}
        self.graph_workspace = make_graph_workspace(cfg, specs, device)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(make_prefill_workspace(device), self._kv_layout)
        self.alibi_stage: Optional[Callable[..., torch.Tensor]] = None

    def add_family(self, spec: FamilySpec) -> None:
        self.specs[spec.name] = spec
        self.eager[spec.name] = make_family_wrappers(spec, self.cfg, self.device)
        self.indptr_host[spec.name] = torch.zeros(self.cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        if spec.alibi:
            self.alibi_stage = make_alibi_stage(self.eager[spec.name].decode)

    def init_family_buffers(self, fam: str) -> None:
        c, dev = self.cfg, self.device
        bufs = {
            "kv_indptr": torch.zeros(c.max_graph_bs + 1, dtype=torch.int32, device=dev),
            "kv_indices": torch.zeros(c.max_graph_bs * c.max_pages_per_seq, dtype=torch.int32, device=dev),
            "kv_last_page_len": torch.zeros(c.max_graph_bs, dtype=torch.int32, device=dev),
        }
        bufs["kv_last_page_len"].fill_(1)  # ok: FC104
        self.graph_bufs[fam] = bufs
        self.bucket_wrappers[fam] = {bs: make_bucket_wrapper(self.graph_workspace, bufs, bs) for bs in c.graph_buckets}

    def warm_kernels(self) -> int:
        """Count the families whose decode module is already JIT-compiled."""
        loaded = 0
        for _, wset in self.eager.items():
            if getattr(wset.decode, "_cached_module", None) is not None:  # expect: FC103
                loaded += 1
        return loaded

    def _heads(self, spec: FamilySpec):
        return spec.num_qo_heads, spec.num_kv_heads, spec.head_dim, self.cfg.page_size

    # ------------------------------------------------------------- per step
    def prepare_step(self, fam: str, batch: FamilyBatch) -> None:
        spec, wset = self.specs[fam], self.eager[fam]
        n = batch.num_rows
        max_len = int(batch.seq_lens_cpu.max())  # ok: FC101
        if max_len > self.cfg.max_model_len:
            raise ValueError(f"{fam}: sequence of {max_len} tokens exceeds {self.cfg.max_model_len}")
        if n + 1 > self.indptr_host[fam].numel():
            self.indptr_host[fam] = torch.empty(2 * (n + 1), dtype=torch.int32, pin_memory=True)  # ok: FC107
        indptr = self.indptr_host[fam][: n + 1]
        indptr.copy_(batch.kv_indptr_cpu)
        wset.decode.plan(indptr, batch.kv_indices, batch.last_page_len_cpu, *self._heads(spec), **plan_kwargs(spec))  # ok: FC102
        if wset.window is None:
            return
        if (batch.seq_lens_cpu > spec.window).any():  # ok: FC101
            hits = (batch.seq_lens > spec.window).sum()
            logger.debug(f"{fam}: {hits} rows attend through the sliding window")  # expect: FC101
        w_indptr = window_kv_indptr(batch.seq_lens, spec.window, self.cfg.page_size)
        wset.window.plan(  # expect: FC102
            w_indptr, batch.window_kv_indices, batch.last_page_len_cpu, *self._heads(spec),
            window_left=spec.window_left, **plan_kwargs(spec),
        )

    def prepare_replay(self, fam: str, bs: int, batch: FamilyBatch) -> None:
        spec, bufs = self.specs[fam], self.graph_bufs[fam]
        n = batch.num_rows
        nnz = int(batch.kv_indptr_cpu[n])
        bufs["kv_indices"][:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        last = pad_last_page_len(batch.last_page_len_cpu, bs)
        self.bucket_wrappers[fam][bs].plan(
            pad_indptr(batch.kv_indptr_cpu, bs), bufs["kv_indices"][:nnz], last, *self._heads(spec),
            **plan_kwargs(spec),
        )
        window = self.eager[fam].window
        if window is not None:
            w_indptr = window_kv_indptr(batch.seq_lens_cpu, spec.window, self.cfg.page_size)
            window.plan(  # ok: FC102
                pad_indptr(w_indptr, bs), batch.window_kv_indices, last, *self._heads(spec),
                window_left=spec.window_left, **plan_kwargs(spec),
            )
        bufs["kv_indptr"][n + 1 : bs + 1].fill_(nnz)  # expect: FC104

    def plan_bucket_dummy(self, fam: str, bs: int) -> None:
        """Plan a bucket over the null page before its graph is captured."""
        spec = self.specs[fam]
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        indices = self.graph_bufs[fam]["kv_indices"][:bs]
        self.bucket_wrappers[fam][bs].plan(indptr_cpu, indices, last_cpu, *self._heads(spec), **plan_kwargs(spec))
        window = self.eager[fam].window
        if window is not None:
            window.plan(indptr_cpu, indices, last_cpu, *self._heads(spec), window_left=spec.window_left,
                        **plan_kwargs(spec))

    def plan_prefill(self, fam: str, qo_indptr_cpu, kv_indptr_cpu, kv_indices, last_page_len_cpu) -> None:
        spec = self.specs[fam]
        self.prefill_wrapper.plan(
            qo_indptr_cpu, kv_indptr_cpu, kv_indices, last_page_len_cpu, *self._heads(spec), causal=True,
            window_left=spec.window_left, logits_soft_cap=spec.attn_soft_cap, pos_encoding_mode=spec.pos_encoding_mode,
        )

    # ------------------------------------------------------------- forward
    def forward_window(self, fam: str, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.eager[fam].window.run(q, kv_cache)  # expect: FC108

    def attend(self, fam: str, layer_idx: int, q: torch.Tensor, kv_cache: torch.Tensor, bs: Optional[int]):
        spec = self.specs[fam]
        if spec.alibi:
            return self.alibi_stage(q, kv_cache)
        if spec.is_local(layer_idx):
            return self.forward_window(fam, q, kv_cache)
        if bs is not None:
            w = self.bucket_wrappers[fam][bs]
        else:
            w = self.eager[fam].decode
        return w.run(q, kv_cache)  # ok: FC108

    def prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)
