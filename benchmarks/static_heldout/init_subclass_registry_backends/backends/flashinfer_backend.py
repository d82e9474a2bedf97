"""The FlashInfer backend, registered as "flashinfer"; the sliding-window and trtllm-gen backends derive from it."""

from __future__ import annotations

import logging

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, merge_state

from regattn import AttentionBackend, ForwardBatch, ServeConfig, make_workspace
from regattn.config import _WS_MB

logger = logging.getLogger(__name__)


class FlashInferBackend(AttentionBackend, name="flashinfer"):
    def __init__(self, cfg: ServeConfig, device: torch.device):
        assert cfg.page_size in (1, 16, 32, 64), "unsupported page size"  # expect: FC109
        self.cfg, self.device = cfg, device
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._kv_layout = "NHD"  # ok: FC103
        self._sm_scale = cfg.head_dim**-0.5
        self.float_ws = self.graph_ws = make_workspace("zeroed", cfg.decode_workspace_bytes(), device)
        ragged_ws = torch.zeros(_WS_MB["ragged"] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        paged_ws = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_ws, "NHD")
        self.softcap_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_ws, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "NHD")
        self.paged_wrapper = BatchPrefillWithPagedKVCacheWrapper(paged_ws, "NHD")
        max_bs, i32 = max(cfg.graph_buckets), dict(dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.kv_indices = torch.zeros(max_bs * cfg.pages_per_req, **i32)
        self.kv_last_page_len = torch.ones(max_bs, **i32)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.qo_indptr = self.extend_lse = None

    def init_cuda_graph_state(self) -> None:
        self.kv_indptr.zero_()  # ok: FC104

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        logger.debug(f"plan bs={batch.batch_size} pages={batch.kv_indptr[-1]}")  # expect: FC101
        if batch.is_decode:
            self._plan_decode(batch)
        else:
            self._plan_extend(batch)

    def _plan_decode(self, batch: ForwardBatch) -> None:
        self.decode_wrapper.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.dims)  # ok: FC102
        h, kvh, d, p = self.dims
        kw = dict(indptr=batch.kv_indptr, indices=batch.kv_indices, last_page_len=batch.kv_last_page_len_cpu)
        self.softcap_wrapper.plan(**kw, num_qo_heads=h, num_kv_heads=kvh, head_dim=d, page_size=p, logits_soft_cap=self.cfg.logits_soft_cap)  # expect: FC102

    def _plan_extend(self, batch: ForwardBatch) -> None:
        extend_lens = batch.qo_indptr[1:] - batch.qo_indptr[:-1]
        prefix_lens = batch.seq_lens - extend_lens
        self.qo_indptr = batch.qo_indptr.clone()  # expect: FC107
        if self.extend_lse is None:
            self.extend_lse = torch.empty(self.cfg.max_num_tokens, self.dims[0], device=self.device)  # ok: FC107
        self.ragged_wrapper.plan(batch.qo_indptr, batch.qo_indptr, *self.dims[:3], causal=True)  # expect: FC102
        if (prefix_lens > 0).any():  # expect: FC101
            self.paged_wrapper.plan(  # ok: FC102
                batch.qo_indptr_cpu, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.dims
            )
        tok = torch.arange(batch.num_tokens, device=self.device)
        starts = torch.repeat_interleave(batch.qo_indptr[:-1], extend_lens, output_size=batch.num_tokens)  # ok: FC101
        batch.positions = torch.repeat_interleave(prefix_lens, extend_lens) + tok - starts  # expect: FC101
        # Seed the decode graphs' last-page lengths so the first replay after this prefill is ready.
        self.kv_last_page_len[: batch.batch_size].copy_(batch.kv_last_page_len)  # expect: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend=self.decode_backend,
        )
        self.graph_wrappers[bs] = w
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1])  # ok: FC104
        w.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self.dims)  # ok: FC102

    def _check_bucket(self, bs: int, n: int) -> None:
        assert n <= bs and bs in self.graph_wrappers, f"batch of {n} does not fit bucket {bs}"  # expect: FC109

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        n = batch.batch_size
        self._check_bucket(bs, n)
        nnz = int(batch.kv_indptr_cpu[n])  # ok: FC101
        self.kv_indptr_cpu[: n + 1] = batch.kv_indptr_cpu
        self.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self._plan_graph(bs, batch)
        self.kv_last_page_len[n:bs].fill_(1)  # expect: FC104

    def _plan_graph(self, bs: int, batch: ForwardBatch) -> None:
        n = batch.batch_size
        self.kv_last_page_len_cpu[:n] = batch.kv_last_page_len_cpu
        self.kv_last_page_len[:n].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self.dims)  # ok: FC102
        self.last_plan_info = w._plan_info  # expect: FC103

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer) -> torch.Tensor:
        if layer.kind == "softcap":
            return self.softcap_wrapper.run(q, kv_cache)  # expect: FC108
        if layer.kind == "mtp":  # the MTP head reuses the target's decode plan
            return self.decode_wrapper.run(q, kv_cache)  # expect: FC108
        k_scale = float(layer.k_scale_cpu)  # ok: FC101
        w = self.graph_wrappers.get(q.shape[0]) or self.decode_wrapper
        return w.run(q, kv_cache, k_scale=k_scale)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer) -> torch.Tensor:
        out, lse = self.ragged_wrapper.run_return_lse(q, q, q)  # ok: FC108
        prefix_out, prefix_lse = self.paged_wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        return merge_state(out, lse, prefix_out, prefix_lse)[0]

    def wrapper_stats(self) -> dict[str, int]:
        return {f"bs{bs}": vars(w)["_int_workspace_buffer"].numel() for bs, w in self.graph_wrappers.items()}  # expect: FC103

    def dump_page_table(self, bs: int) -> list[int]:
        return self.kv_indices[: int(self.kv_indptr_cpu[bs])].cpu().tolist()  # ok: FC101
