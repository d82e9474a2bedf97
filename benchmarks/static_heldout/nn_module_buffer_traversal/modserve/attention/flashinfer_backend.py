"""FlashInfer attention backend whose graph inputs are buffers of a model submodule.

The backend finds everything it needs by walking the model: the graph inputs are
``model.get_submodule("attn_state")`` and the attention layers are grouped by
window once, from ``model.named_modules()``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from torch import nn

from modserve.batch import ForwardBatch
from modserve.config import PAGE_SIZE, WORKSPACE_BYTES, EngineConfig
from modserve.layers.attention import PagedAttention
from modserve.layers.buffers import GraphInputBuffers, HostMirrors
from modserve.memory import PagedKVPool

logger = logging.getLogger(__name__)


class FlashInferModuleBackend:
    def __init__(
        self,
        cfg: EngineConfig,
        model: nn.Module,
        host: HostMirrors,
        kv_pool: PagedKVPool,
        device: torch.device,
    ):
        self.cfg = cfg
        self.host = host
        self.kv_pool = kv_pool
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.graph_state: GraphInputBuffers = model.get_submodule("attn_state")
        self.layer_groups: Dict[str, List[str]] = defaultdict(list)
        for name, mod in model.named_modules():
            if isinstance(mod, PagedAttention):
                self.layer_groups[mod.window_key].append(name)
        self._check_layer_groups()

        self.workspace_buffer = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.window_workspace = torch.zeros(cfg.window_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_wrappers: Dict[str, BatchDecodeWithPagedKVCacheWrapper] = {
            "full": BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, self._kv_layout),
            "window": BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, self._kv_layout),
        }
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.decode_graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"

    def _check_layer_groups(self) -> None:
        n = sum(len(names) for names in self.layer_groups.values())
        assert n == self.cfg.num_layers, "every decoder layer has one PagedAttention"  # ok: FC109

    # ------------------------------------------------------------------ host side

    def _update_host_mirrors(self, fb: ForwardBatch, n: int, pad_to: Optional[int] = None) -> int:
        host = self.host
        seq = fb.seq_lens_cpu[:n].numpy()
        pages = (seq + PAGE_SIZE - 1) // PAGE_SIZE
        host.kv_indptr_np[0] = 0
        np.cumsum(pages, out=host.kv_indptr_np[1 : n + 1])
        host.kv_last_page_len_np[:n] = seq - (pages - 1) * PAGE_SIZE
        total = pad_to or n
        if total > n:
            host.kv_indptr_np[n + 1 : total + 1] = host.kv_indptr_np[n]
            host.kv_last_page_len_np[n:total] = 1
        state = self.graph_state
        state.kv_indptr[: total + 1].copy_(host.kv_indptr[: total + 1], non_blocking=True)  # ok: FC104
        state.kv_last_page_len[:total].copy_(host.kv_last_page_len[:total], non_blocking=True)
        state.seq_lens[:n].copy_(fb.seq_lens[:n], non_blocking=True)
        return int(host.kv_indptr_np[n])  # ok: FC101

    def _fill_indices(self, dst: torch.Tensor, fb: ForwardBatch, n: int) -> int:
        indptr = self.host.kv_indptr_np[: n + 1]
        counts = np.diff(indptr)
        total = int(indptr[-1])
        rows = np.repeat(np.arange(n, dtype=np.int64), counts)
        cols = np.arange(total, dtype=np.int64) - np.repeat(indptr[:-1].astype(np.int64), counts)
        rows_t = torch.from_numpy(rows).to(self.device, non_blocking=True)
        cols_t = torch.from_numpy(cols).to(self.device, non_blocking=True)
        pool_rows = fb.req_pool_indices.index_select(0, rows_t)
        dst[:total].copy_(self.kv_pool.req_to_page[pool_rows, cols_t])
        return total

    # ------------------------------------------------------------------ per step

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.is_decode:
            self._update_host_mirrors(fb, fb.batch_size)
            self._plan_decode_groups(fb)
        else:
            self._plan_extend(fb)

    def _plan_decode_groups(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        host = self.host
        cfg = self.cfg
        state = self.graph_state
        self._fill_indices(state.kv_indices, fb, bs)  # ok: FC104
        for key in self.layer_groups:
            w = self.decode_wrappers[key]
            if key == "full":
                w.plan(  # ok: FC102
                    host.kv_indptr[: bs + 1],
                    state.kv_indices,
                    host.kv_last_page_len[:bs],
                    cfg.num_qo_heads,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    PAGE_SIZE,
                    q_data_type=cfg.kv_dtype,
                    kv_data_type=cfg.kv_dtype,
                )
                continue
            # The window group reads its inputs back from the module buffers.
            bufs = dict(state.named_buffers())
            max_len = bufs["seq_lens"][:bs].max().item()  # expect: FC101
            w.plan(  # expect: FC102
                bufs["kv_indptr"][: bs + 1],
                bufs["kv_indices"],
                bufs["kv_last_page_len"][:bs],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                PAGE_SIZE,
                window_left=min(cfg.sliding_window, max_len) - 1,
                q_data_type=cfg.kv_dtype,
                kv_data_type=cfg.kv_dtype,
            )

    def _plan_extend(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        host = self.host
        cfg = self.cfg
        state = self.graph_state
        self._update_host_mirrors(fb, bs)
        host.qo_indptr_np[0] = 0
        np.cumsum(fb.extend_lens_cpu, out=host.qo_indptr_np[1 : bs + 1])
        state.qo_indptr[: bs + 1].copy_(host.qo_indptr[: bs + 1], non_blocking=True)
        self._fill_indices(state.kv_indices, fb, bs)
        self.prefill_wrapper.plan(  # expect: FC102
            state.qo_indptr[: bs + 1],
            state.kv_indptr[: bs + 1],
            state.kv_indices,
            host.kv_last_page_len[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            PAGE_SIZE,
            causal=True,
            q_data_type=cfg.kv_dtype,
            kv_data_type=cfg.kv_dtype,
        )

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, state: GraphInputBuffers) -> None:
        state.register_buffer(
            "decode_workspace",
            torch.empty(self.cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=self.device),  # expect: FC105
            persistent=False,
        )
        state.kv_indptr.zero_()  # ok: FC104
        state.kv_last_page_len.fill_(1)
        state.kv_indices.zero_()

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        state = self.graph_state
        w = BatchDecodeWithPagedKVCacheWrapper(
            state.get_buffer("decode_workspace"),
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=state.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=state.kv_indices,
            paged_kv_last_page_len_buffer=state.kv_last_page_len[:bs],
            backend=self.graph_decode_backend,
        )
        self.decode_graph_wrappers[bs] = w
        self._update_host_mirrors(fb, bs)
        self._plan_graph_decode(w, bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: ForwardBatch) -> None:
        state = self.graph_state
        self._update_host_mirrors(fb, raw_bs, pad_to=bs)
        self._fill_indices(state.kv_indices, fb, raw_bs)
        self._plan_graph_decode(self.decode_graph_wrappers[bs], bs)
        self.host.seq_lens[:raw_bs].copy_(fb.seq_lens_cpu[:raw_bs])  # ok: FC104

    def _plan_graph_decode(self, w: BatchDecodeWithPagedKVCacheWrapper, bs: int) -> None:
        cfg = self.cfg
        w.plan(  # ok: FC102
            self.host.kv_indptr[: bs + 1],
            self.graph_state.kv_indices,
            self.host.kv_last_page_len[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            PAGE_SIZE,
            q_data_type=cfg.kv_dtype,
            kv_data_type=cfg.kv_dtype,
        )

    # ------------------------------------------------------------------ forward

    def forward_decode(self, q, k, v, layer: PagedAttention, fb: ForwardBatch) -> torch.Tensor:
        self.kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v, layer.k_scale, layer.v_scale)
        cache = self.kv_pool.get_kv(layer.layer_id)
        if layer.sliding_window is not None:
            # No graph-mode wrapper for the window group: the eager one carries window_left.
            return self.decode_wrappers["window"].run(q, cache)  # expect: FC108
        w = self.decode_graph_wrappers[fb.batch_size] if fb.use_graph else self.decode_wrappers["full"]
        return w.run(q, cache)  # ok: FC108

    def forward_extend(self, q, k, v, layer: PagedAttention, fb: ForwardBatch) -> torch.Tensor:
        self.kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v, layer.k_scale, layer.v_scale)
        cache = self.kv_pool.get_kv(layer.layer_id)
        return self.prefill_wrapper.run(q, cache)  # ok: FC108
