"""The prototype FlashInfer wrappers and the per-bucket clones made from them.

The engine builds one ``DecodeWrapperSet`` at start-up: eager prototypes (decode, prefill,
an optional two-level cascade) over shared workspaces. Each bucket runner then asks for a
graph-mode decode wrapper bound to its buffer views (``clone_for_bucket``).
"""

from __future__ import annotations

import copy
import logging
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)

from protoserve.buffers import DecodeBuffers
from protoserve.config import PROTO_WORKSPACE_BYTES, EngineConfig

logger = logging.getLogger(__name__)


class DecodeWrapperSet:
    # float workspace of one bucket's graph wrapper
    CLONE_WORKSPACE_BYTES = 64 << 20

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self.workspace = torch.zeros(PROTO_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_ws_bytes = cfg.max_num_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 2
        self.prefill_workspace = torch.empty(prefill_ws_bytes + (16 << 20), dtype=torch.uint8, device=device)  # ok: FC106
        self.proto = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self._kv_layout, backend="fa2")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self.cascade: Optional[MultiLevelCascadeAttentionWrapper] = None
        if cfg.shared_prefix_cascade:
            self.cascade_workspace = torch.zeros(cfg.cascade_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
            self.cascade = MultiLevelCascadeAttentionWrapper(2, self.cascade_workspace, self._kv_layout)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def __deepcopy__(self, memo) -> "DecodeWrapperSet":
        """A private set for a deep-cloned runner: its own decode workspace and prototype.

        The prefill and cascade prototypes only run eagerly and stay shared.
        """
        new = DecodeWrapperSet.__new__(DecodeWrapperSet)
        memo[id(self)] = new
        new.cfg = self.cfg
        new.device = self.device
        new._kv_layout = self._kv_layout
        ref = self.proto._float_workspace_buffer  # expect: FC103
        new.workspace = torch.empty(self.cfg.workspace_bytes, dtype=ref.dtype, device=ref.device)  # ok: FC105
        new.prefill_workspace = self.prefill_workspace
        new.proto = BatchDecodeWithPagedKVCacheWrapper(new.workspace, new._kv_layout, backend="fa2")
        new.prefill = self.prefill
        new.cascade = self.cascade
        if self.cascade is not None:
            new.cascade_workspace = self.cascade_workspace
        new.graph_wrappers = {}
        return new

    # -- per-bucket clones -----------------------------------------------------------------

    def clone_for_bucket(self, bs: int, bufs: DecodeBuffers) -> BatchDecodeWithPagedKVCacheWrapper:
        """A graph-mode decode wrapper for bucket ``bs`` over the views of ``bufs``."""
        assert bs <= bufs.max_bs  # expect: FC109
        if self.cfg.trtllm_graph_wrappers:
            return self._clone_trtllm_for_bucket(bs, bufs)
        if self.cfg.clone_graph_wrappers and self.graph_wrappers:
            return self._shallow_graph_clone(bs, bufs)
        ws = torch.zeros(self.CLONE_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        w = BatchDecodeWithPagedKVCacheWrapper(
            ws,
            self._kv_layout,  # ok: FC103
            use_cuda_graph=True,
            paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=bufs.kv_indices,
            paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def _clone_trtllm_for_bucket(self, bs: int, bufs: DecodeBuffers) -> BatchDecodeWithPagedKVCacheWrapper:
        ws = torch.empty(self.cfg.workspace_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        w = BatchDecodeWithPagedKVCacheWrapper(
            ws,
            "HND",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=bufs.kv_indices,
            paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
            backend="trtllm-gen",
        )
        self.graph_wrappers[bs] = w
        return w

    def _shallow_graph_clone(self, bs: int, bufs: DecodeBuffers) -> BatchDecodeWithPagedKVCacheWrapper:
        """Reuse the largest bucket's graph wrapper (and its workspace) for a smaller bucket.

        ``copy.copy`` keeps graph mode and the bound indices buffer; the per-batch views are
        pointed at this bucket's rows.
        """
        src = self.graph_wrappers[max(self.graph_wrappers)]
        w = copy.copy(src)
        for name, view in (
            ("_paged_kv_indptr_buf", bufs.kv_indptr[: bs + 1]),
            ("_paged_kv_last_page_len_buf", bufs.kv_last_page_len[:bs]),
        ):
            setattr(w, name, view)  # expect: FC103
        w._fixed_batch_size = bs  # expect: FC103
        self.graph_wrappers[bs] = w
        logger.debug("bucket %d: shallow clone of the bs=%d graph wrapper", bs, max(self.graph_wrappers))
        return w

    def is_graph_wrapper(self, w: BatchDecodeWithPagedKVCacheWrapper) -> bool:
        return w.is_cuda_graph_enabled
