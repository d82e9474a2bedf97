import logging
import os
from typing import Dict
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, MultiLevelCascadeAttentionWrapper
from .batch import ForwardBatch
from .config import EngineConfig
from .interfaces import AttentionBackend, KVPool, WorkspaceProvider

logger = logging.getLogger(__name__)


class PagedPrefillWrapper(BatchPrefillWithPagedKVCacheWrapper):
    def describe(self) -> str:
        return f"paged-prefill/{self._kv_layout}"  # expect: FC103

def _copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=True)

class FlashInferBackend(AttentionBackend):
    WINDOW_WS_BYTES = 96 << 20

    def __init__(self, config: EngineConfig, workspaces: WorkspaceProvider, pool: KVPool):
        self.cfg, self.device, self.pool, self.max_bs = config, torch.device(config.device), pool, config.max_bs
        self.heads = (config.num_qo_heads, config.num_kv_heads, config.head_dim, config.page_size)
        self._kv_layout = "NHD"  # ok: FC103
        self._plan_info: Dict[str, tuple] = {}  # ok: FC103
        ws = workspaces.float_workspace()
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, self._kv_layout)
        self.softcap_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, self._kv_layout)
        self.prefill_wrapper = PagedPrefillWrapper(workspaces.prefill_workspace(), self._kv_layout)
        ragged_workspace = torch.empty(config.max_num_tokens * 2048, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace, self._kv_layout, backend="fa3")
        window_workspace = torch.empty(self.WINDOW_WS_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.window_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(window_workspace, self._kv_layout)
        cascade_bytes = int(os.environ.get("DI_CASCADE_WS_MB", "256")) << 20
        cascade_workspace = torch.empty(cascade_bytes, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, cascade_workspace, self._kv_layout)
        self._decode_plan = self.decode_wrapper.plan
        n = config.max_bs
        self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(config.num_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(n, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_dev = torch.zeros(config.max_num_tokens + 1, dtype=torch.int32, device=self.device)
        self.positions_scratch = None
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace = None
        pool.add_free_hook(self._scrub_freed_pages)

    def init_cuda_graph_state(self, max_bs: int) -> None:
        assert max_bs <= self.max_bs, "graph batch larger than max_bs"  # expect: FC109
        per_req = self.cfg.num_qo_heads * self.cfg.head_dim * 4 * 16
        self.graph_workspace = torch.empty(max_bs * per_req, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.kv_indptr.zero_()  # ok: FC104
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        assert fb.batch_size <= self.max_bs  # expect: FC109
        if fb.is_decode:  # ok: FC101
            self._plan_decode(fb)
        else:
            self._plan_extend(fb)

    def _plan_decode(self, fb: ForwardBatch) -> None:
        if (fb.seq_lens > self.cfg.max_context).any():  # expect: FC101
            raise ValueError(f"sequence longer than max_context={self.cfg.max_context}: {fb.seq_lens}")  # ok: FC101
        heads = self.heads
        self._decode_plan(fb.kv_indptr, fb.kv_indices, fb.kv_last_page_len_cpu, *heads, q_data_type=torch.bfloat16)  # expect: FC102
        rows_cpu = (fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu)
        self.softcap_decode_wrapper.plan(*rows_cpu, *heads, logits_soft_cap=30.0)  # ok: FC102
        self.window_decode_wrapper.plan(fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu, *heads, window_left=4095)  # ok: FC102
        if self.cfg.use_cascade:
            shared_indptr_cpu = torch.tensor([0, fb.batch_size], dtype=torch.int32)
            self.cascade_wrapper.plan(  # ok: FC102
                [shared_indptr_cpu, fb.qo_indptr_cpu], [shared_indptr_cpu, fb.kv_indptr_cpu],
                [fb.kv_indices[:1], fb.kv_indices], [self.kv_last_page_len_cpu[:1], fb.kv_last_page_len_cpu], *heads)
        self._plan_info["decode"] = (fb.batch_size, int(fb.seq_lens_cpu.max()))  # ok: FC101

    def _plan_extend(self, fb: ForwardBatch) -> None:
        extend_lens = fb.extend_lens.tolist()  # expect: FC101
        if sum(fb.extend_lens) > self.cfg.max_num_tokens:  # expect: FC101
            raise ValueError(f"extend batch too large: {extend_lens}")
        if max(fb.extend_lens_cpu.tolist()) > self.cfg.max_context:  # ok: FC101
            raise ValueError(f"extend longer than max_context={self.cfg.max_context}")
        bs = fb.batch_size
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(fb.extend_lens, 0, out=qo_indptr[1:])
        used_indices = fb.kv_indices[: fb.kv_indptr[-1]]  # expect: FC101
        prefix_rows = (fb.prefix_lens > 0).nonzero()  # expect: FC101
        heads = (self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr, fb.kv_indptr_cpu, used_indices, fb.kv_last_page_len_cpu, *heads, self.cfg.page_size, causal=True)
        self.ragged_wrapper.plan(fb.qo_indptr_cpu, fb.qo_indptr_cpu, *heads, causal=True)  # ok: FC102
        self.qo_indptr_dev = qo_indptr.clone()  # expect: FC107
        fb.qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        fb.qo_indptr.copy_(qo_indptr)
        if self.positions_scratch is None:
            self.positions_scratch = torch.empty(self.cfg.max_num_tokens, dtype=torch.int64, device=self.device)  # ok: FC107
        logger.debug("planned extend bs=%d prefixed=%d lens=%s", bs, prefix_rows.shape[0], fb.extend_lens)  # ok: FC101

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, self._kv_layout, use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
        self.kv_indptr[: bs + 1].copy_(fb.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        w.plan(fb.kv_indptr_cpu[: bs + 1], fb.kv_indices, self.kv_last_page_len[:bs], *self.heads)  # expect: FC102
        self.graph_wrappers[bs] = w

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        w = self.graph_wrappers[bs]
        real_bs = fb.batch_size
        n_pages = int(fb.kv_indptr_cpu[real_bs])  # ok: FC101
        _copy_rows(self.kv_indptr[: real_bs + 1], fb.kv_indptr[: real_bs + 1])  # ok: FC104
        self.kv_indices[:n_pages].copy_(fb.kv_indices[:n_pages])  # ok: FC104
        self.kv_last_page_len_cpu[:real_bs].copy_(fb.kv_last_page_len_cpu)  # ok: FC101
        last = self.kv_indptr[real_bs].item()  # expect: FC101
        w.plan(self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self.heads)  # expect: FC102
        self.kv_last_page_len[real_bs:bs].fill_(1)  # expect: FC104
        self.kv_indptr_cpu[real_bs + 1 :].fill_(last)  # ok: FC104

    def forward_decode(self, q, layer, fb: ForwardBatch):
        bs = fb.batch_size
        kv = self.pool.kv_cache(layer.layer_id)
        if layer.sliding_window > 0:
            if fb.evicted_slots is not None:
                self.kv_indices[fb.evicted_slots] = 0  # expect: FC104
            _copy_rows(self.kv_last_page_len[:bs], fb.kv_last_page_len)  # expect: FC104
            out, _lse = self.window_decode_wrapper.run_return_lse(q, kv)  # expect: FC108
            return out
        if layer.logits_soft_cap > 0:
            return self.softcap_decode_wrapper.run(q, kv)  # expect: FC108
        if self.cfg.use_cascade:
            return self.cascade_wrapper.run(q, kv)  # expect: FC108
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.decode_wrapper
        return w.run(q, kv)  # ok: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch):
        kv = self.pool.kv_cache(layer.layer_id)
        kv[fb.out_cache_loc] = torch.stack((k, v), dim=1)
        torch.cumsum(fb.seq_lens, 0, out=self.kv_indptr[1 : fb.batch_size + 1])  # expect: FC104
        if not layer.uses_paged_prefix:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, kv)  # ok: FC108

    def _scrub_freed_pages(self, pages: torch.Tensor) -> None:
        self.kv_indices[pages.to(self.device)] = 0  # expect: FC104

    def debug_state(self) -> dict:
        return {
            "decode_plan": self.decode_wrapper._plan_info,  # expect: FC103
            "cascade_levels": self.cascade_wrapper._num_levels,  # expect: FC103
            "graph": {bs: w.is_cuda_graph_enabled for bs, w in self.graph_wrappers.items()},  # ok: FC103
            "graph_indptr": [w._paged_kv_indptr_buf.data_ptr() for w in self.graph_wrappers.values()],  # expect: FC103
            "last_plan": self._plan_info,  # ok: FC103
            "pool_layout": self.pool._kv_layout,  # ok: FC103
            "prefill": self.prefill_wrapper.describe(),
            "total_pages": self.kv_indptr[-1].item(),  # ok: FC101
        }
