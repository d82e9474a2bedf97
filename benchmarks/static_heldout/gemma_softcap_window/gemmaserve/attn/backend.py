"""FlashInfer attention for alternating sliding-window / global layers with attention logit soft-capping.

Each layer type has its own wrappers, its own workspace and its own plan parameters (``window_left`` and
``logits_soft_cap``): FlashInfer bakes both into the plan, so a sliding layer can never run on a plan made for a
global layer.  Sliding layers only see the pages inside their window; global layers see every page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from gemmaserve.attn.workspace import make_layer_workspaces, prefill_workspace, trtllm_global_workspace
from gemmaserve.common import LAYER_ROW, GemmaConfig, LayerType, PlanParams, StepBatch, plan_params_for

# attribute under which FlashInfer keeps the JIT-compiled kernel module of a wrapper
_JIT_MODULE_ATTR = "_cached_module"


class WindowView:
    """Which pages of each sequence a sliding layer reads, computed on the device."""

    def __init__(self, seq_lens: torch.Tensor, window: int, page_size: int) -> None:
        self.seq_lens = seq_lens
        self.window = window
        self.page_size = page_size

    @property
    def first_page(self) -> torch.Tensor:
        return torch.clamp(self.seq_lens - self.window, min=0) // self.page_size

    @property
    def pages_per_seq(self) -> torch.Tensor:
        end = (self.seq_lens + self.page_size - 1) // self.page_size
        return end - self.first_page

    @property
    def num_pages(self) -> int:
        return int(self.pages_per_seq.sum())  # expect: FC101


@dataclass
class GraphBuffers:
    """Buffers the graph-mode wrappers are bound to, with their pinned host mirrors."""

    kv_indptr: torch.Tensor  # [2, max_bs + 1], one row per layer type (LAYER_ROW)
    kv_indices: torch.Tensor  # [2, max_pages]
    kv_last_page_len: torch.Tensor  # [max_bs], shared by both layer types
    kv_indptr_cpu: torch.Tensor
    kv_indices_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor

    @classmethod
    def allocate(cls, cfg: GemmaConfig, device: torch.device) -> "GraphBuffers":
        max_bs = cfg.max_batch_size
        pages = max_bs * cfg.max_pages_per_seq
        return cls(
            torch.zeros(2, max_bs + 1, dtype=torch.int32, device=device),
            torch.zeros(2, pages, dtype=torch.int32, device=device),
            torch.ones(max_bs, dtype=torch.int32, device=device),
            torch.zeros(2, max_bs + 1, dtype=torch.int32, pin_memory=True),
            torch.zeros(2, pages, dtype=torch.int32, pin_memory=True),
            torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
        )


class GemmaFlashInferBackend:
    def __init__(self, cfg: GemmaConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch_size
        max_pages = max_bs * cfg.max_pages_per_seq

        self.plan_params: Dict[LayerType, PlanParams] = {lt: plan_params_for(cfg, lt) for lt in LayerType}
        self.workspaces = make_layer_workspaces(cfg, device)
        self.prefill_ws = prefill_workspace(cfg, device)
        major, _ = torch.cuda.get_device_capability(device)
        # trtllm-gen has no logit soft-capping: only Gemma-3 (no attention cap) may take it
        self.use_trtllm_global = major >= 10 and cfg.attn_logit_softcap is None
        self.trtllm_workspace = trtllm_global_workspace(cfg, device) if self.use_trtllm_global else None

        # eager metadata: device buffers for the kernels, pinned mirrors for plan()
        self.kv_indptr = {lt: torch.zeros(max_bs + 1, dtype=torch.int32, device=device) for lt in LayerType}
        self.kv_indices = {lt: torch.zeros(max_pages, dtype=torch.int32, device=device) for lt in LayerType}
        self.kv_indptr_cpu = {lt: torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True) for lt in LayerType}
        self.kv_indices_cpu = {lt: torch.zeros(max_pages, dtype=torch.int32, pin_memory=True) for lt in LayerType}
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.trtllm_seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.max_seq_len = cfg.max_context_len

        self.decode_wrappers = {
            lt: BatchDecodeWithPagedKVCacheWrapper(self.workspaces[lt], "NHD", backend="fa2") for lt in LayerType
        }
        # GQA groups of 2 on the 2B/9B shapes: tensor cores pay off for the global layers' long KV
        self.global_tc_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.workspaces[LayerType.GLOBAL], "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.prefill_wrappers = {
            lt: BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2") for lt in LayerType
        }
        self.graph_wrappers: Dict[int, Dict[LayerType, BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.graph_bs: Optional[int] = None
        self.is_extend = False
        # what each layer type was last planned with, for the debug endpoint
        self._plan_info: Dict[LayerType, PlanParams] = {}
        self.shape = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self.jit_ready = self._jit_module_ready()

    def _kernel_kwargs(self, lt: LayerType) -> Dict[str, object]:
        p = self.plan_params[lt]
        return dict(window_left=p.window_left, logits_soft_cap=p.logits_soft_cap, sm_scale=p.sm_scale,
                    q_data_type=torch.bfloat16)

    def _jit_module_ready(self) -> bool:
        # both layer types share head_dim and dtypes, so one JIT build serves every decode wrapper
        mod = getattr(self.decode_wrappers[LayerType.GLOBAL], _JIT_MODULE_ATTR, None)  # expect: FC103
        return mod is not None

    # ------------------------------------------------------------------ per-step metadata (eager)
    def init_forward_metadata(self, batch: StepBatch) -> None:
        self.is_extend = batch.extend_lens is not None
        if self.is_extend:
            self._plan_extend(batch)
            return
        bs = batch.batch_size
        g = LayerType.GLOBAL
        indptr_g, nnz = self._fill_global_pages(batch)
        self.max_seq_len = int(batch.seq_lens_cpu.max())  # ok: FC101
        if self.use_trtllm_global:
            self.fill_block_tables(batch)
        gw = self.global_tc_decode if self.cfg.use_tc_for_global else self.decode_wrappers[g]
        gw.plan(  # ok: FC102
            indptr_g, self.kv_indices[g][:nnz], self.kv_last_page_len_cpu[:bs], *self.shape, **self._kernel_kwargs(g)
        )

        # sliding layers: trim every sequence to the pages inside the window, on the device
        s = LayerType.SLIDING
        view = WindowView(batch.seq_lens, self.cfg.sliding_window, self.cfg.page_size)
        pages = view.pages_per_seq
        s_indptr = self.kv_indptr[s]
        s_indptr[1 : bs + 1] = torch.cumsum(pages, 0)
        total = view.num_pages
        req = torch.repeat_interleave(torch.arange(bs, device=self.device), pages, output_size=total)
        col = torch.arange(total, device=self.device) - s_indptr[req] + view.first_page[req]
        self.kv_indices[s][:total] = self.block_tables[req, col]
        self._plan_sliding(self.decode_wrappers[s], s_indptr[: bs + 1], self.kv_indices[s][:total])

    def _plan_sliding(self, wrapper, indptr: torch.Tensor, indices: torch.Tensor) -> None:
        bs = indptr.shape[0] - 1
        wrapper.plan(  # expect: FC102
            indptr, indices, self.kv_last_page_len_cpu[:bs], *self.shape, **self._kernel_kwargs(LayerType.SLIDING)
        )

    def _fill_global_pages(self, batch: StepBatch) -> Tuple[torch.Tensor, int]:
        """Host page lists for the global layers; returns the pinned indptr and the page count."""
        bs = batch.batch_size
        ps = self.cfg.page_size
        g = LayerType.GLOBAL
        lens = batch.seq_lens_cpu.numpy()  # ok: FC101
        pages = (lens + ps - 1) // ps
        indptr_np = self.kv_indptr_cpu[g].numpy()
        indptr_np[0] = 0
        np.cumsum(pages, out=indptr_np[1 : bs + 1])
        nnz = int(indptr_np[bs])
        flat = np.concatenate([batch.page_table_np[i, : pages[i]] for i in range(bs)])
        self.kv_indices_cpu[g][:nnz] = torch.from_numpy(flat)
        self.kv_indices[g][:nnz].copy_(self.kv_indices_cpu[g][:nnz], non_blocking=True)
        self.kv_last_page_len_cpu[:bs] = torch.from_numpy(lens - (pages - 1) * ps)
        return self.kv_indptr_cpu[g][: bs + 1], nnz

    def fill_block_tables(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        width = batch.page_table_np.shape[1]
        self.block_tables[:bs, :width].copy_(torch.from_numpy(batch.page_table_np), non_blocking=True)
        self.trtllm_seq_lens[:bs].copy_(batch.seq_lens, non_blocking=True)

    def _plan_extend(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        kv_indptr_cpu, nnz = self._fill_global_pages(batch)
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        qo_indptr[1:] = torch.cumsum(batch.extend_lens, 0)
        for lt, wrapper in self.prefill_wrappers.items():
            wrapper.plan(  # expect: FC102
                qo_indptr,
                kv_indptr_cpu,
                self.kv_indices[LayerType.GLOBAL][:nnz],
                self.kv_last_page_len_cpu[:bs],
                *self.shape,
                causal=True,
                **self._kernel_kwargs(lt),
            )

    # ------------------------------------------------------------------ CUDA graphs
    def bind_graph_wrappers(self, bs: int, bufs: GraphBuffers) -> None:
        wrappers: Dict[LayerType, BatchDecodeWithPagedKVCacheWrapper] = {}
        for lt in LayerType:
            row = LAYER_ROW[lt]
            wrappers[lt] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspaces[lt],
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=bufs.kv_indptr[row, : bs + 1],
                paged_kv_indices_buffer=bufs.kv_indices[row],
                paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
                backend="fa2",
            )
        self.graph_wrappers[bs] = wrappers

    def plan_graph(self, bs: int, bufs: GraphBuffers, nnz: Sequence[int]) -> None:
        """Plan the bucket's graph wrappers from the pinned mirrors (the device rows are already filled)."""
        for lt, w in self.graph_wrappers[bs].items():
            row = LAYER_ROW[lt]
            p = self.plan_params[lt]
            w.plan(  # ok: FC102
                bufs.kv_indptr_cpu[row, : bs + 1],
                bufs.kv_indices[row, : nnz[row]],
                bufs.kv_last_page_len_cpu[:bs],
                *self.shape,
                **self._kernel_kwargs(lt),
            )
            # older FlashInfer builds silently dropped window_left for decode; refuse to replay such a plan
            if w._window_left != p.window_left:  # expect: FC103
                raise RuntimeError(f"{lt.value}: planned window_left differs from {p.window_left}")
            self._plan_info[lt] = p  # ok: FC103

    # ------------------------------------------------------------------ attention
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        lt = self.cfg.layer_type(layer_id)
        if lt is LayerType.GLOBAL and self.use_trtllm_global:
            return self._trtllm_global(q, kv_cache)
        if lt is LayerType.GLOBAL and self.cfg.use_tc_for_global:
            return self.global_tc_decode.run(q, kv_cache)  # expect: FC108
        wrapper = self.decode_wrappers[lt] if self.graph_bs is None else self.graph_wrappers[self.graph_bs][lt]
        return wrapper.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill_wrappers[self.cfg.layer_type(layer_id)].run(q, kv_cache)

    def _trtllm_global(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        bs = q.shape[0]
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.trtllm_workspace, self.block_tables[:bs], self.trtllm_seq_lens[:bs], self.max_seq_len,
            bmm1_scale=self.plan_params[LayerType.GLOBAL].sm_scale, bmm2_scale=1.0,
        )
