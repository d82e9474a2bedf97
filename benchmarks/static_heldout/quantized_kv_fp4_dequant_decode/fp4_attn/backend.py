"""FlashInfer decode over an FP4 KV cache: pages are dequantised into a bf16 staging area per layer."""

import functools
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from fp4kv import FP8_E4M3_MAX, FP4Config, FP4PageCache, pack_e2m1
from fp4kv.compat import FLOAT_WS_ATTR

from .metadata import DecodeMeta
from .workspace import eager_workspace, graph_workspace, prefill_workspace, trtllm_workspace


class FP4DequantBackend:
    def __init__(self, cfg: FP4Config, cache: FP4PageCache, device):
        self.cfg = cfg
        self.cache = cache
        self.device = device
        self._plan_info: Dict[int, tuple] = {}  # ok: FC103
        self.graph_ws = graph_workspace(cfg, device)
        self.eager_ws = eager_workspace(device)
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD", use_tensor_cores=True)
        self.sink_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD", use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg, device), "NHD",
                                                                   backend="fa2")
        max_bs = cfg.max_graph_bs
        self.max_staging = cfg.staging_pages(max_bs)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(self.max_staging, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.staging_slot_ids = torch.arange(self.max_staging, dtype=torch.int32, device=device)
        # FP4 page ids behind each staging slot; -1 marks an unused slot (not a wrapper buffer)
        self.page_ids_buf = torch.full((self.max_staging,), -1, dtype=torch.int32, device=device)
        self.indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.staging_kv: Optional[torch.Tensor] = None
        self.scale_scratch: Optional[torch.Tensor] = None
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.current: Optional[DecodeMeta] = None
        self.pending_recalibration = False
        self._head_args = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self) -> None:
        cfg = self.cfg
        self.staging_kv = torch.zeros((self.max_staging, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim),
                                      dtype=cfg.dtype, device=self.device)
        self.kv_indptr_buf.zero_()  # ok: FC104
        for bs in cfg.buckets:
            self.decode_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )

    def memory_report(self) -> Dict[str, int]:
        float_ws = getattr(self.eager_decode, FLOAT_WS_ATTR)  # expect: FC103
        return {"graph_ws": self.graph_ws.numel(), "eager_ws": float_ws.numel(),
                "staging": 0 if self.staging_kv is None else self.staging_kv.numel() * 2}

    # ------------------------------------------------------------ per step
    def init_forward_metadata(self, meta: DecodeMeta) -> None:
        """Eager decode for batches beyond the largest graph bucket."""
        cfg = self.cfg
        n = meta.num_pages
        if self.staging_kv is None or self.staging_kv.shape[0] < n:
            self.staging_kv = torch.empty((n, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim), dtype=cfg.dtype, device=self.device)  # expect: FC107
        if self.scale_scratch is None:
            self.scale_scratch = torch.zeros(cfg.max_batch, cfg.num_kv_heads, dtype=torch.float32, device=self.device)  # ok: FC107
        self.page_ids_buf[:n].copy_(meta.kv_indices, non_blocking=True)
        self.page_ids_buf[n:].fill_(-1)
        self.current = meta
        if not cfg.native_fp4:
            self.eager_decode.plan(meta.kv_indptr, self.staging_slot_ids[:n], meta.last_page_len_cpu, *self._head_args,  # expect: FC102
                                   q_data_type=cfg.dtype, kv_data_type=cfg.dtype)
        self._plan_sinks(meta)

    def init_forward_metadata_prefill(self, qo_indptr_cpu, meta: DecodeMeta) -> None:
        self._plan_prefill(qo_indptr_cpu, meta)
        self.current = meta

    def _plan_prefill(self, qo_indptr_cpu, meta: DecodeMeta) -> None:
        plan = functools.partial(self.prefill_wrapper.plan, causal=True, q_data_type=self.cfg.dtype)
        plan(qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len, *self._head_args)  # expect: FC102

    def _plan_sinks(self, meta: DecodeMeta) -> None:
        self.sink_decode.plan(meta.sink_indptr_cpu, meta.sink_indices, meta.sink_last_page_len_cpu,
                              *self._head_args, q_data_type=self.cfg.dtype, kv_data_type=self.cfg.dtype)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        self.page_ids_buf[:bs].zero_()
        self.decode_wrappers[bs].plan(indptr_cpu, self.staging_slot_ids[:bs], last_cpu, *self._head_args,  # ok: FC102
                                      q_data_type=self.cfg.dtype, kv_data_type=self.cfg.dtype)
        self.sink_decode.plan(indptr_cpu, torch.zeros(bs, dtype=torch.int32, device=self.device), last_cpu,
                              *self._head_args, q_data_type=self.cfg.dtype, kv_data_type=self.cfg.dtype)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMeta) -> None:
        bs_real = meta.batch_size
        n = meta.num_pages
        if self.cache.needs_recalibration:
            self.pending_recalibration = True
        self.page_ids_buf[:n].copy_(meta.kv_indices, non_blocking=True)
        self.page_ids_buf[n:].fill_(-1)
        self.indptr_host[: bs_real + 1].copy_(meta.kv_indptr_cpu)
        self.indptr_host[bs_real + 1 : bs + 1] = n
        self.last_page_len_host[:bs_real].copy_(meta.last_page_len_cpu)
        self.last_page_len_host[bs_real:bs] = 1
        self.kv_indices_buf[:n].copy_(self.staging_slot_ids[:n])  # ok: FC104
        self.decode_wrappers[bs].plan(self.indptr_host[: bs + 1], self.kv_indices_buf[:n], self.last_page_len_host[:bs],  # ok: FC102
                                      *self._head_args, q_data_type=self.cfg.dtype, kv_data_type=self.cfg.dtype)
        self._plan_sinks(meta)
        self._plan_info[bs] = (bs_real, n)
        # padding rows must not contribute to the merged output
        self.last_page_len_buf[bs_real:bs].zero_()  # expect: FC104
        self.current = meta

    # -------------------------------------------------------------- forward
    def dequant_for_layer(self, layer: int) -> None:
        page_ids = self.page_ids_buf
        valid = page_ids[page_ids >= 0]  # expect: FC101
        n = valid.shape[0]
        self.cache.dequant_into(layer, valid, self.staging_kv)  # ok: FC104
        self.kv_indices_buf[:n].copy_(self.staging_slot_ids[:n])  # expect: FC104

    def forward_decode(self, layer: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        if self.cfg.native_fp4 and bs > self.cfg.max_graph_bs:
            return self._decode_native(layer, q)
        self.dequant_for_layer(layer)
        w = self.eager_decode if bs > self.cfg.max_graph_bs else self.decode_wrappers[bs]
        o, lse = w.run(q, self.staging_kv, return_lse=True)  # ok: FC108
        o_sink, lse_sink = self.sink_decode.run(q, self.cache.sink_kv[layer], return_lse=True)  # expect: FC108
        out, _ = merge_state(o, lse, o_sink, lse_sink)
        return out

    def _decode_native(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        meta = self.current
        ws = trtllm_workspace(self.cfg.trtllm_workspace_bytes(), str(self.device))
        kv = (self.cache.packed[layer], self.cache.scales[layer])
        return trtllm_batch_decode_with_kv_cache(q, kv, ws, meta.block_tables, meta.seq_lens, meta.max_seq_len, bmm1_scale=self.cfg.head_dim ** -0.5,
                                                 bmm2_scale=1.0)

    def forward_extend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        self.dequant_for_layer(layer)
        return self.prefill_wrapper.run(q, self.staging_kv)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, scales: torch.Tensor):
        for kv, x in ((0, k), (1, v)):
            packed, block_scales = pack_e2m1(x, scales[layer])
            self.cache.packed[layer, kv].view(-1, *packed.shape[1:]).index_copy_(0, out_loc, packed)
            self.cache.scales[layer, kv].view(-1, *block_scales.shape[1:]).index_copy_(0, out_loc, block_scales)
            self.cache.overflow_count += (block_scales.float() >= FP8_E4M3_MAX).sum().to(torch.int32)
