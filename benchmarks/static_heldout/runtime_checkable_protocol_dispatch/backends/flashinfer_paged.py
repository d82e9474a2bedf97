import logging
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from rcengine.batch import StepMeta
from rcengine.config import ServeConfig, WorkspaceSizes
from rcengine.workspaces import get_decode_workspace, get_prefill_workspace

logger = logging.getLogger(__name__)


def _describe(self) -> str:
    return f"paged-decode[{self._kv_layout}]"  # expect: FC103


BatchDecodeWithPagedKVCacheWrapper.describe = _describe


def fill_tail(buf: torch.Tensor, start: int, value: int) -> None:
    buf[start:].fill_(value)


class PagedDecodeBackend:
    """FlashInfer paged attention. Satisfies AttentionImpl, SupportsEagerPlan and SupportsCudaGraph."""

    def __init__(self, cfg: ServeConfig, kv_cache):
        self.cfg, self.kv_cache, self.device = cfg, kv_cache, torch.device(cfg.device)
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._kv_layout = "NHD"  # ok: FC103
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(get_decode_workspace(cfg.device), self._kv_layout)
        swa_workspace = torch.empty(cfg.max_tokens * 1024, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.swa_wrapper = BatchDecodeWithPagedKVCacheWrapper(swa_workspace, self._kv_layout, backend="fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(get_prefill_workspace(cfg.device), self._kv_layout)
        n = cfg.max_batch
        self.kv_indptr_buf = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(cfg.total_pages, dtype=torch.int32, device=self.device)
        self.last_page_len_buf = torch.ones(n, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_buf = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace = None
        self.copy_stream = torch.cuda.Stream()

    def plan_step(self, meta: StepMeta) -> None:
        b = meta.batch
        if b.is_decode:  # ok: FC101
            self.decode_wrapper.plan(b.kv_indptr, b.kv_indices, b.last_page_len_cpu, *self.heads)  # expect: FC102
            self.swa_wrapper.plan(b.kv_indptr_cpu, b.kv_indices, b.last_page_len_cpu, *self.heads, window_left=4095)  # ok: FC102
            return
        self.copy_stream.synchronize()  # expect: FC101
        self.prefill_wrapper.plan(  # ok: FC102
            b.qo_indptr_cpu, b.kv_indptr_cpu, b.kv_indices, b.last_page_len_cpu, *self.heads, causal=True)
        self.qo_indptr_buf = torch.cat([b.qo_indptr, b.qo_indptr[-1:]])  # expect: FC107
        total_pages = b.kv_indptr[-1].item()  # expect: FC101
        self._plan_info = (b.batch_size, total_pages)  # ok: FC103
        logger.debug("extend plan over %d pages, lens %s", total_pages, b.seq_lens)  # ok: FC101

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_workspace = torch.empty(WorkspaceSizes.GRAPH, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr_buf.zero_()  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: StepMeta) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, self._kv_layout, use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1], paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs])
        self.last_page_len_buf[:bs].fill_(1)  # ok: FC104
        w.plan(  # expect: FC102
            indptr=self.kv_indptr_buf[: bs + 1], indices=self.kv_indices_buf, last_page_len=meta.padded_last_page_len_cpu[:bs],
            num_qo_heads=self.cfg.num_qo_heads, num_kv_heads=self.cfg.num_kv_heads, head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size)
        setattr(w, "_fixed_batch_size", bs)  # expect: FC103
        self.graph_wrappers[bs] = w

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: StepMeta) -> None:
        assert bs in self.graph_wrappers, f"batch size {bs} was never captured"  # expect: FC109
        b, real = meta.batch, meta.batch.batch_size
        self.kv_indptr_buf[: real + 1].copy_(b.kv_indptr, non_blocking=True)  # ok: FC104
        fill_tail(self.kv_indptr_buf[: bs + 1], real + 1, int(b.kv_indptr_cpu[real]))  # ok: FC104
        indptr_host = b.kv_indptr.cpu()  # expect: FC101
        n_pages = int(indptr_host[real])  # ok: FC101
        self.kv_indices_buf[:n_pages].copy_(b.kv_indices[:n_pages], non_blocking=True)  # ok: FC104
        self.kv_indptr_host[: bs + 1].copy_(meta.padded_kv_indptr_cpu[: bs + 1])
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf, meta.padded_last_page_len_cpu[:bs], *self.heads)
        self.last_page_len_buf[real:bs].fill_(1)  # expect: FC104
        self.kv_indptr_host[bs + 1 :].zero_()  # ok: FC104

    def forward_decode(self, q, layer, meta: StepMeta):
        kv = self.kv_cache[layer.layer_id]
        if layer.sliding_window > 0:
            return self.swa_wrapper.run(q, kv)  # expect: FC108
        if layer.layer_id == 0 and meta.graph_bs is not None:
            real = meta.batch.batch_size
            self.kv_indptr_buf[real + 1 :] = self.kv_indptr_buf[real]  # expect: FC104
        w = self.decode_wrapper if meta.graph_bs is None else self.graph_wrappers[meta.graph_bs]
        return w.run(q, kv)  # ok: FC108

    def forward_extend(self, q, k, v, layer, meta: StepMeta):
        return self.prefill_wrapper.run(q, self.kv_cache[layer.layer_id])  # ok: FC108

    def advance_after_accept(self, accepted: torch.Tensor, bs: int) -> None:
        self.last_page_len_buf[:bs] += accepted  # expect: FC104

    def debug_stats(self) -> dict:
        return {
            "graph_mode": self.decode_wrapper._use_cuda_graph,  # expect: FC103
            "plan": vars(self.decode_wrapper).get("_plan_info"),  # expect: FC103
            "graphs": {bs: w.is_cuda_graph_enabled for bs, w in self.graph_wrappers.items()},  # ok: FC103
            "pages_in_use": int(self.kv_indptr_buf[-1]),  # ok: FC101
        }
