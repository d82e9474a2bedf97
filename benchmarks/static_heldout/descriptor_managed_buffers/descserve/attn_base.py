"""Attention backend base: the page-table declarations every backend (and the drafter) shares."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List

import numpy as np
import torch

from descserve_kernels.paged_ops import PagedKVPool, build_kv_indices

from .config import EngineConfig
from .descriptors import DeviceBuffer, HostView, PinnedMirror, Workspace

if TYPE_CHECKING:
    from .forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# One declaration per page-table tensor.  The backends below and the drafter place these
# very objects in their class bodies (``kv_indptr = KV_INDPTR``); every instance still
# gets its own storage, allocated on first access.
KV_INDPTR = DeviceBuffer(lambda o: o.max_bs + 1)
KV_INDICES = DeviceBuffer(lambda o: o.max_bs * o.max_pages_per_req)
KV_LAST_PAGE_LEN = DeviceBuffer(lambda o: o.max_bs, fill=1)
KV_INDPTR_CPU = PinnedMirror(lambda o: o.max_bs + 1)
KV_INDPTR_NP = HostView("kv_indptr_cpu")
LAST_PAGE_LEN_CPU = PinnedMirror(lambda o: o.max_bs)
LAST_PAGE_LEN_NP = HostView("last_page_len_cpu")


class AttnBackendBase:
    """Shared state and helpers of the attention backends.

    Subclasses build their FlashInfer wrappers in ``__init__`` and bind graph-mode wrappers
    to ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` in ``init_cuda_graph_state``.
    """

    _backend = "fa2"
    _kv_layout = "NHD"

    kv_indptr = KV_INDPTR
    kv_indices = KV_INDICES
    kv_last_page_len = KV_LAST_PAGE_LEN
    kv_indptr_cpu = KV_INDPTR_CPU
    kv_indptr_np = KV_INDPTR_NP
    last_page_len_cpu = LAST_PAGE_LEN_CPU
    last_page_len_np = LAST_PAGE_LEN_NP

    # The planners' float workspace, shared by every wrapper of one backend.
    float_workspace = Workspace(lambda o: o.cfg.workspace_bytes())

    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool, req_to_page: torch.Tensor, device: torch.device) -> None:
        self.cfg = cfg
        self.kv_pool = kv_pool
        self.req_to_page = req_to_page
        self.device = torch.device(device)
        self.max_bs = max(cfg.max_running_requests, cfg.cuda_graph_max_bs)
        self.max_pages_per_req = cfg.max_pages_per_req
        self.page_size = cfg.page_size
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.max_num_tokens = cfg.max_num_tokens
        self.sliding_window = cfg.sliding_window
        self.has_window_layers = cfg.sliding_window > 0 and cfg.sliding_window_every > 0
        self.graph_wrappers: Dict[int, Any] = {}
        self._active_bs = 0

    @property
    def kv_layout(self) -> str:
        return self._kv_layout  # ok: FC103

    # -- dispatch ------------------------------------------------------------------------

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: "ForwardBatch") -> torch.Tensor:
        self.kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
        if fb.forward_mode.is_decode():
            return self.forward_decode(q, layer, fb)
        return self.forward_extend(q, k, v, layer, fb)

    def forward_decode(self, q: torch.Tensor, layer: Any, fb: "ForwardBatch") -> torch.Tensor:
        raise NotImplementedError

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, fb: "ForwardBatch") -> torch.Tensor:
        raise NotImplementedError

    # -- metadata --------------------------------------------------------------------------

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        raise NotImplementedError

    def init_cuda_graph_state(self, capture_bs: List[int]) -> None:
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> None:
        raise NotImplementedError

    def all_wrappers(self) -> List[Any]:
        return list(self.graph_wrappers.values())

    # -- page-table staging (host first, then one copy to the device) --------------------

    def _fill_page_mirrors(self, bs: int, seq_lens_cpu: torch.Tensor) -> int:
        """Fill the pinned indptr / last-page mirrors from host lengths; return the page count."""
        lens = seq_lens_cpu[:bs].numpy().astype(np.int64)
        pages = (lens + self.page_size - 1) // self.page_size
        indptr = self.kv_indptr_np
        indptr[0] = 0
        np.cumsum(pages, out=indptr[1 : bs + 1])
        self.last_page_len_np[:bs] = lens - (pages - 1) * self.page_size
        return int(indptr[bs])

    def _stage_page_table(self, bs: int, seq_lens_cpu: torch.Tensor, req_pool_indices: torch.Tensor) -> int:
        total = self._fill_page_mirrors(bs, seq_lens_cpu)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.last_page_len_cpu[:bs], non_blocking=True)
        build_kv_indices(self.req_to_page, req_pool_indices, self.kv_indptr, self.kv_indices, total)
        return total

    def _stage_padded(self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor) -> int:
        """Stage ``raw_bs`` real rows and pad to the captured ``bs`` with empty requests."""
        total = self._fill_page_mirrors(raw_bs, seq_lens_cpu)
        self.kv_indptr_np[raw_bs + 1 : bs + 1] = total
        self.last_page_len_np[raw_bs:bs] = 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        build_kv_indices(self.req_to_page, req_pool_indices[:raw_bs], self.kv_indptr, self.kv_indices, total)
        return total

    def _use_tensor_cores(self) -> bool:
        return self.num_qo_heads // self.num_kv_heads >= 4
