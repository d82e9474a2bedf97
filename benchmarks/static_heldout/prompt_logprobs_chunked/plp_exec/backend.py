"""Chunked paged prefill, eager decode and per-bucket graph decode over FlashInfer."""

import functools
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from plp.config import LogprobConfig
from plp_exec.compat import MAX_ROWS_ATTR
from plp_exec.metadata import ChunkPrefillMeta, DecodeGraphBuffers, DecodeMeta
from plp_exec.workspace import default_graph_workspace_bytes, make_decode_workspace, make_prefill_workspace


class ChunkedAttentionBackend:
    def __init__(self, cfg: LogprobConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._sm_scale = cfg.head_dim ** -0.5
        prefill_backend = "trtllm-gen" if cfg.use_trtllm_prefill else "fa2"
        self.prefill_ws = make_prefill_workspace(cfg, device)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend=prefill_backend)
        self.decode_ws = make_decode_workspace(cfg, device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", backend="fa2")
        self.tc_workspace = torch.empty(cfg.max_batch * cfg.num_qo_heads * cfg.head_dim * 256, dtype=torch.uint8, device=device)  # ok: FC106
        self.tc_decode = BatchDecodeWithPagedKVCacheWrapper(self.tc_workspace, "NHD", use_tensor_cores=True)
        self._plan_prefill_fn = functools.partial(
            self.prefill_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            page_size=cfg.page_size,
            causal=True,
        )
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.bufs: Optional[DecodeGraphBuffers] = None
        self.max_chunk_len = 0

    def init_graph_buffers(self) -> None:
        cfg = self.cfg
        mb = max(cfg.decode_buckets)
        self.bufs = DecodeGraphBuffers(
            kv_indptr=torch.zeros(mb + 1, dtype=torch.int32, device=self.device),
            kv_indices=torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device),
            kv_last_page_len=torch.zeros(mb, dtype=torch.int32, device=self.device),
        )
        self.indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.indices_pinned = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.indptr_np = self.indptr_pinned.numpy()
        self.indices_np = self.indices_pinned.numpy()
        self.last_np = self.last_pinned.numpy()
        self.graph_workspace = torch.zeros(default_graph_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC106
        for bs in cfg.decode_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.bufs.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.bufs.kv_indices,
                paged_kv_last_page_len_buffer=self.bufs.kv_last_page_len[:bs],
            )
        self.bufs.kv_last_page_len.fill_(1)  # ok: FC104

    # ----------------------------------------------------------- prefill
    def init_forward_metadata(self, meta: ChunkPrefillMeta) -> None:
        qo_lens = (meta.qo_indptr[1:] - meta.qo_indptr[:-1]).cpu()  # expect: FC101
        self.max_chunk_len = int(qo_lens.max())
        self._plan_prefill_fn(  # expect: FC102
            meta.qo_indptr_cpu,
            meta.kv_indptr_gpu,
            meta.kv_indices,
            meta.last_page_len_cpu,
        )

    def planned_rows(self) -> Optional[int]:
        return getattr(self.prefill_wrapper, MAX_ROWS_ATTR, None)  # expect: FC103

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    # ------------------------------------------------------------ decode
    def plan_decode(self, meta: DecodeMeta) -> None:
        cfg = self.cfg
        for w in (self.decode_wrapper, self.tc_decode):
            w.plan(  # ok: FC102
                meta.kv_indptr_cpu,
                meta.kv_indices,
                meta.last_page_len_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
            )

    def _plan_bucket(self, bs: int) -> None:
        cfg = self.cfg
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.indptr_pinned[: bs + 1],
            self.bufs.kv_indices,
            self.last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=self._sm_scale,  # ok: FC103
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.indptr_np[: bs + 1] = np.arange(bs + 1, dtype=np.int32)
        self.last_np[:bs] = 1
        self._plan_bucket(bs)

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, real_bs: int, seq_lens_np: np.ndarray, page_table_np: np.ndarray
    ) -> None:
        ps = self.cfg.page_size
        bufs = self.bufs
        pages = (seq_lens_np[:real_bs] + ps - 1) // ps
        self.indptr_np[0] = 0
        np.cumsum(pages, out=self.indptr_np[1 : real_bs + 1])
        nnz = int(self.indptr_np[real_bs])
        self.indptr_np[real_bs + 1 : bs + 1] = nnz
        for i in range(real_bs):
            self.indices_np[self.indptr_np[i] : self.indptr_np[i + 1]] = page_table_np[i, : pages[i]]
        self.last_np[:real_bs] = seq_lens_np[:real_bs] - (pages - 1) * ps
        self.last_np[real_bs:bs] = 1
        bufs.kv_indices[:nnz].copy_(self.indices_pinned[:nnz], non_blocking=True)  # ok: FC104
        bufs.kv_indptr[: real_bs + 1].copy_(self.indptr_pinned[: real_bs + 1], non_blocking=True)
        bufs.kv_last_page_len[:bs].copy_(self.last_pinned[:bs], non_blocking=True)
        self._plan_bucket(bs)
        bufs.kv_indptr[real_bs + 1 : bs + 1] = nnz  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if self.cfg.gqa_ratio >= 4:
            return self.tc_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[bs] if self.cfg.use_graphs else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108
