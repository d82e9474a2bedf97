"""FlashInfer backend: eager FA2 wrappers, graph-mode decode wrappers per bucket and a trtllm-gen MTP draft."""
from typing import Dict, Optional, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from sdengine.batches import DecodeBatch
from sdengine.config import EngineConfig, graph_workspace_bytes
from sdengine.workspace import draft_workspace, make_workspace, shared_float_workspace

from .factories import DecodeMeta, PrefillMeta, make_wrapper, plan_dims


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device, decode_ws: torch.Tensor, ragged_ws: torch.Tensor):
        acfg = cfg.decode
        self.cfg, self.acfg, self.device, self.max_bs = cfg, acfg, device, acfg.max_batch_size
        self._plan_info: Dict[int, tuple] = {}
        self.decode_wrapper = make_wrapper("decode", decode_ws)
        self.ragged_wrapper = make_wrapper("ragged", ragged_ws)
        self.window_wrapper = make_wrapper("window", shared_float_workspace(str(device), acfg.float_workspace_bytes))
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            draft_workspace(str(device), cfg.trtllm.workspace_bytes), "HND", backend="trtllm-gen")
        self.kv_indptr_buf = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(acfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.empty(self.max_bs, dtype=torch.int32, device=device)
        self.last_page_len_buf.fill_(1)  # ok: FC104
        self.kv_indptr_pinned = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.out_buf: Optional[torch.Tensor] = None

    @classmethod
    def from_config(cls, cfg: EngineConfig, device: torch.device) -> "FlashInferBackend":
        assert cfg.decode.page_size == cfg.prefill.page_size, "decode and prefill share one page pool"  # expect: FC109
        return cls(cfg, device, make_workspace(cfg.decode, device), make_workspace(cfg.prefill, device))

    def init_cuda_graph_wrappers(self, buckets: Sequence[int]) -> None:
        self.graph_workspace = torch.empty(graph_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr_buf.zero_()  # ok: FC104
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1], paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )

    def _check_bucket(self, bs: int) -> None:
        assert bs in self.graph_wrappers, f"no graph wrapper for bucket {bs}"  # expect: FC109

    def plan_capture(self, bs: int) -> DecodeMeta:
        assert self.graph_wrappers, "init_cuda_graph_wrappers() must run first"  # ok: FC109
        self._check_bucket(bs)
        self.last_page_len_buf[:bs].fill_(1)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(  # expect: FC102
            self.kv_indptr_buf[: bs + 1], self.kv_indices_buf, self.last_page_len_buf[:bs], *plan_dims(self.acfg)
        )
        return DecodeMeta(w, self.window_wrapper, bs)

    def plan_replay(self, batch: DecodeBatch, bs: int) -> None:
        n = batch.batch_size
        nnz = int(batch.kv_indptr_cpu[n])  # ok: FC101
        if nnz > self.kv_indices_buf.numel():  # ok: FC101
            self.kv_indices_buf = torch.empty(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indptr_pinned[: n + 1].copy_(batch.kv_indptr_cpu)  # ok: FC101
        self.kv_indptr_pinned[n + 1 : bs + 1] = nnz
        self.last_page_len_pinned[:n].copy_(batch.kv_last_page_len_cpu)
        self.last_page_len_pinned[n:bs] = 1
        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_pinned[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_pinned[: bs + 1], self.kv_indices_buf[:nnz], self.last_page_len_pinned[:bs], *plan_dims(self.acfg)
        )
        self._plan_info[bs] = (n, nnz)  # ok: FC103

    def plan_draft(self, batch: DecodeBatch) -> None:
        a = self.acfg
        self.draft_wrapper.plan(  # expect: FC102
            **dict(indptr=batch.kv_indptr, indices=batch.kv_indices, last_page_len=batch.kv_last_page_len_cpu,
                   num_qo_heads=a.num_qo_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, page_size=a.page_size)
        )

    def forward_decode(self, meta: DecodeMeta, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if layer_id % 2 == 1 and meta.window_wrapper is not None:
            return meta.window_wrapper.run(q, kv_cache)  # expect: FC108
        return meta.wrapper.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, meta: PrefillMeta, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.out_buf is None or self.out_buf.shape[0] < meta.num_tokens:
            self.out_buf = torch.empty(meta.num_tokens, *q.shape[1:], dtype=q.dtype, device=self.device)  # expect: FC107
        return self.ragged_wrapper.run(q, k, v, out=self.out_buf[: meta.num_tokens])  # ok: FC108

    def forward_draft(self, meta: DecodeMeta, q, k, v, draft_kv: torch.Tensor) -> torch.Tensor:
        ctx = self.ragged_wrapper.run(q, k, v)  # expect: FC108
        self.last_page_len_buf[: meta.bs].add_(1)  # expect: FC104
        return self.draft_wrapper.run(ctx[: meta.bs], draft_kv)  # expect: FC108

    def debug_snapshot(self) -> dict:
        return {
            "graph_plans": {bs: w._plan_info for bs, w in self.graph_wrappers.items()},  # expect: FC103
            "window_layout": self.window_wrapper._kv_layout,  # expect: FC103
            "eager_indptr": vars(self.decode_wrapper).get("_paged_kv_indptr_buf"),  # expect: FC103
            "own_plans": dict(self._plan_info),  # ok: FC103
            "ragged_int_ws": self.ragged_wrapper._int_workspace_buffer.numel(),  # expect: FC103
            "jit_ready": hasattr(self.draft_wrapper, "_cached_module"),  # expect: FC103
            "nnz": self.kv_indptr_buf[-1].item(),  # ok: FC101
        }
