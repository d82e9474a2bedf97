"""FlashInfer decode backend with per-bucket graph wrappers that the autoscaler can add and drop."""

import logging
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from slo import SLOConfig

from .batch import DecodeBatch
from .workspace import eager_workspace, graph_workspace, make_eager_decode

logger = logging.getLogger(__name__)


class MeteredBackend:
    PREFILL_WS_BYTES = 256 * 1024 * 1024

    def __init__(self, cfg: SLOConfig, device):
        self.cfg = cfg
        self.device = device
        self._plan_info: Dict[int, dict] = {}  # ok: FC103
        self._kv_layout = "HND"
        self.graph_ws = graph_workspace(cfg, device)
        self.eager_ws = eager_workspace(cfg, device)
        self.prefill_ws = torch.zeros(self.PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_decode = make_eager_decode(self.eager_ws, self._kv_layout)
        self._eager_plan = self.eager_decode.plan
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, self._kv_layout, backend="fa2")
        # bound buffers sized for max_batch so that any bucket set fits without reallocation
        max_bs = cfg.max_batch
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        # graph inputs of the model, not wrapper buffers
        self.seq_lens_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.out_loc_buf = torch.zeros(max(cfg.initial_buckets), dtype=torch.int64, device=device)
        self.indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_cache = torch.zeros((cfg.num_layers, cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim),
                                    dtype=cfg.dtype, device=device)
        self.padding_scratch: Optional[torch.Tensor] = None
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.spill_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.retired: List[BatchDecodeWithPagedKVCacheWrapper] = []
        self._heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)

    # ----------------------------------------------------------- bucket set
    def init_cuda_graph_state(self, buckets) -> None:
        self.kv_indptr_buf.zero_()  # ok: FC104
        for bs in buckets:
            self.add_bucket(bs)

    def add_bucket(self, bs: int) -> None:
        self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws, self._kv_layout, use_cuda_graph=True, backend="trtllm-gen",
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
        )

    def add_spill_bucket(self, bs: int) -> None:
        """A bucket admitted past `max_graphs`: it shares the eager workspace."""
        self.spill_wrappers[bs] = make_eager_decode(self.eager_ws, self._kv_layout)  # ok: FC103

    def grow_graph_buffers(self, max_bs: int) -> None:
        if max_bs > self.out_loc_buf.shape[0]:
            self.out_loc_buf = torch.zeros(max_bs, dtype=torch.int64, device=self.device)  # expect: FC107

    # ------------------------------------------------------------- per step
    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        """Eager decode for a batch no bucket covers."""
        kv_indptr = F.pad(torch.cumsum(batch.page_counts, 0, dtype=torch.int32), (1, 0))
        self._eager_plan(kv_indptr, batch.kv_indices, batch.last_page_len_cpu, *self._heads)  # expect: FC102
        if self.padding_scratch is None:
            self.padding_scratch = torch.zeros(self.cfg.max_batch, self.cfg.hidden, dtype=self.cfg.dtype, device=self.device)  # ok: FC107

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        w = self.spill_wrappers.get(bs) or self.graph_wrappers[bs]
        w.plan(indptr_cpu, self.kv_indices_buf[:bs], last_cpu, *self._heads)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch, seq_lens: torch.Tensor) -> None:
        bs_real = batch.batch_size
        n = int(batch.kv_indptr_cpu[-1])
        logger.debug(f"replay bucket={bs} rows={bs_real} max_len={seq_lens.max()}")  # expect: FC101
        self.indptr_pinned[: bs_real + 1].copy_(batch.kv_indptr_cpu)
        self.indptr_pinned[bs_real + 1 : bs + 1] = n
        self.last_page_len_pinned[:bs_real].copy_(batch.last_page_len_cpu)
        self.last_page_len_pinned[bs_real:bs] = 1
        if bs in self.spill_wrappers:
            self.spill_wrappers[bs].plan(self.indptr_pinned[: bs + 1], batch.kv_indices, self.last_page_len_pinned[:bs],
                                         *self._heads)
        else:
            self.kv_indices_buf[:n].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
            self.graph_wrappers[bs].plan(self.indptr_pinned[: bs + 1], self.kv_indices_buf[:n], self.last_page_len_pinned[:bs],  # ok: FC102
                                         *self._heads)
        self.seq_lens_buf[:bs_real].copy_(seq_lens, non_blocking=True)
        self.seq_lens_buf[bs_real:bs].fill_(1)  # ok: FC104
        self._plan_info[bs] = {"rows": bs_real, "pages": n}

    # --------------------------------------------------------------- forward
    def forward_decode(self, layer: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        if bs in self.spill_wrappers:
            return self.spill_wrappers[bs].run(q, self.kv_cache[layer])  # expect: FC108
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_decode
        return w.run(q, self.kv_cache[layer])  # ok: FC108

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        pages = out_loc // self.cfg.page_size
        slots = out_loc % self.cfg.page_size
        self.kv_cache[layer, pages, 0, :, slots] = k
        self.kv_cache[layer, pages, 1, :, slots] = v
