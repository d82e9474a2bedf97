"""FlashInfer attention for the async engine: decode graphs per bucket, a paged
prefill for mixed steps and a trtllm-gen decode for batches with very long rows."""
from typing import Any, Dict, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, append_paged_kv_cache

from asched import AsyncSchedConfig

from .metadata import StepMetadata
from .workspace import graph_decode_workspace, long_decode_workspace, prefill_workspace


class AsyncFlashInferBackend:
    def __init__(self, cfg: AsyncSchedConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_bucket
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        graph_ws = graph_decode_workspace(device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                graph_ws, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            for bs in cfg.graph_buckets
        }
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg), "NHD", backend="fa2")
        self.long_decode: Optional[BatchDecodeWithPagedKVCacheWrapper] = (
            BatchDecodeWithPagedKVCacheWrapper(long_decode_workspace(cfg), "HND", backend="trtllm-gen")
            if cfg.long_row_threshold > 0 else None
        )
        self._plan_kwargs: Dict[str, Any] = dict(
            num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            page_size=cfg.page_size, q_data_type=torch.bfloat16,
        )
        self._plan_info: Dict[Tuple[str, int], Tuple[int, int]] = {}  # ok: FC103

    def init_graph_buffers(self) -> None:
        self.last_page_len_buf.fill_(1)  # ok: FC104
        self.kv_indptr_buf.zero_()

    def dummy_decode_meta(self, bs: int, positions: torch.Tensor) -> StepMetadata:
        return StepMetadata(
            num_reqs=bs, num_tokens=bs,
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indices=self.kv_indices_buf,
            kv_indptr_dev=self.kv_indptr_buf[: bs + 1],
            last_page_len_dev=self.last_page_len_buf[:bs],
            batch_indices=torch.arange(bs, dtype=torch.int32, device=self.device),
            positions=positions,
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            logits_indices=torch.arange(bs, dtype=torch.int64, device=self.device),
            has_long_rows=False,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: StepMetadata) -> None:
        w = self.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"bucket {bs} wrapper was built for another batch size")
        self.kv_indptr_host[: bs + 1].copy_(meta.kv_indptr_cpu)
        self.last_page_len_host[:bs].fill_(1)
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs], **self._plan_kwargs
        )

    def prepare_replay(self, bs: int, meta: StepMetadata) -> None:
        n = meta.num_reqs
        host_indptr = self.kv_indptr_host.numpy()
        host_indptr[: n + 1] = meta.kv_indptr_cpu.numpy()
        host_indptr[n + 1 : bs + 1] = host_indptr[n]
        self.last_page_len_host[:n].copy_(meta.kv_last_page_len_cpu)
        self.last_page_len_host[n:bs].fill_(1)
        num_pages = int(host_indptr[n])
        self.kv_indices_buf[:num_pages].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs], **self._plan_kwargs
        )
        # padded rows attend to one token of page 0
        self.last_page_len_buf[n:bs].fill_(1)  # expect: FC104
        self._plan_info[("decode", bs)] = (n, num_pages)

    def plan_prefill(self, meta: StepMetadata) -> None:
        c = self.cfg
        self.prefill_wrapper.plan(  # expect: FC102
            meta.qo_indptr_cpu, meta.kv_indptr_dev, meta.kv_indices, meta.kv_last_page_len_cpu,
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True, q_data_type=torch.bfloat16,
        )
        self._plan_info[("prefill", meta.num_reqs)] = (meta.num_tokens, meta.kv_indices.shape[0])

    def plan_long_rows(self, meta: StepMetadata) -> None:
        if self.long_decode is None:
            raise RuntimeError("long-row decode is disabled (long_row_threshold=0)")
        self.long_decode.plan(  # expect: FC102
            meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_dev, **self._plan_kwargs
        )

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, meta: StepMetadata) -> None:
        append_paged_kv_cache(
            k, v, meta.batch_indices, meta.positions, kv_cache,
            meta.kv_indices, meta.kv_indptr_dev, meta.last_page_len_dev,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, meta: StepMetadata) -> torch.Tensor:
        if self.long_decode is not None and meta.has_long_rows:
            return self.long_decode.run(q, kv_cache)  # ok: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)
