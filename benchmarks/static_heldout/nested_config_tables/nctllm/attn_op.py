"""FlashInfer attention op (rtp-llm's PyFlashinfer*AttnOp: ``prepare`` / ``prepare_cuda_graph`` / ``forward``).

Every knob comes from the config tables: the eager decode backend from the KV dtype table, wrapper
options from ``cfg["decode"]`` (filtered to what the constructor accepts), graph batch sizes from
``cfg["cuda_graph"]``, workspaces from ``cfg["attention"]["workspace_mb"]`` and the workspace tables.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)

from nct_cfg.tables import DECODE_BACKEND_BY_KV_DTYPE, DECODE_WRAPPER_KEYS, PREFILL_PLAN_KEYS, TORCH_DTYPES, pick
from nctllm.metadata import FlashInferAttentionMetadata
from nctllm.options import AttnOptions
from nctllm.workspace import alloc_workspace, kind_workspace, tier_workspace

logger = logging.getLogger(__name__)


class FlashInferAttnOp:
    def __init__(self, cfg: Mapping[str, Any], opts: AttnOptions, device: torch.device):
        self.opts = opts
        self.device = device
        attn = cfg["attention"]
        self.graph_cfg = {"enabled": True, "pad_last_page": True, "max_seq_len": 8192, **cfg.get("cuda_graph", {})}
        self.trt_cfg = {"zero_workspace": True, **cfg.get("trtllm", {})}
        self._backend = cfg.get("backend", "fa2")  # ok: FC103
        self._kv_layout = attn.get("kv_layout", "NHD")  # ok: FC103
        self._plan_info: Optional[dict] = None
        self.kv_dtype = getattr(torch, TORCH_DTYPES[attn.get("kv_dtype", "bfloat16")])
        self.q_dtype = getattr(torch, cfg.get("dtype", "bfloat16"))
        self.window_layers = set(opts.window_layers)
        self.prefix_pages = int(attn.get("shared_prefix_pages", 0))
        self.num_mtp_layers = cfg.get("speculative", {}).get("num_mtp_layers", 0)
        self.graph_max_seq_len = self.graph_cfg["max_seq_len"]
        self.max_pages_per_req = cfg.get("kv_cache", {}).get("max_pages_per_req", 2048)
        max_bs = cfg.get("scheduler", {}).get("max_batch_size", 64)

        # options every decode wrapper shares: {**defaults, **cfg["decode"] (the keys __init__ accepts)}
        self.decode_kw = {"use_tensor_cores": opts.use_tensor_cores, **pick(cfg.get("decode", {}), DECODE_WRAPPER_KEYS)}
        self._decode_plan_defaults = dict(
            num_qo_heads=opts.num_qo_heads,
            num_kv_heads=opts.num_kv_heads,
            head_dim=opts.head_dim,
            page_size=opts.page_size,
            pos_encoding_mode=cfg.get("decode", {}).get("pos_encoding_mode", "NONE"),
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
        )
        self.prefill_plan_kw = {"causal": True, **pick(cfg.get("prefill", {}), PREFILL_PLAN_KEYS)}

        # eager decode: the KV dtype table picks the backend (fp8 pages -> trtllm-gen)
        decode_backend = DECODE_BACKEND_BY_KV_DTYPE.get(attn.get("kv_dtype", "bfloat16"), "fa2")
        self.decode_workspace = torch.empty(attn["workspace_mb"] << 20, dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, **{**self.decode_kw, "backend": decode_backend}
        )

        # paged prefill: trtllm-gen where the deployment runs it, FA2 otherwise; zeroing per cfg["trtllm"]
        prefill_backend = "trtllm-gen" if self._backend == "trtllm-gen" else "fa2"
        prefill_ws = alloc_workspace(
            attn["workspace_mb"] << 20, device, zeroed=self.trt_cfg.get("zero_workspace", True)
        )
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_ws, self._kv_layout, backend=prefill_backend)

        # ragged prefill over the new tokens of each request (FA2 only)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(
            tier_workspace("fa2", device), self._kv_layout, backend="fa2"
        )

        # rows longer than any captured graph handles run eagerly on FA2
        self.tail_workspace = torch.empty(attn["workspace_mb"] << 20, dtype=torch.uint8, device=device)  # ok: FC105
        self.tail_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.tail_workspace, self._kv_layout, backend="fa2", **self.decode_kw
        )

        self.window_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        if opts.sliding_window > 0:
            self.window_workspace = torch.zeros(opts.window_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
            self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.window_workspace, self._kv_layout, **self.decode_kw
            )

        # shared system-prompt pages: planned once per prefix, reused by every decode step
        self.prefix_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        if self.prefix_pages > 0:
            self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(
                kind_workspace("prefill", device), self._kv_layout, backend="fa2"
            )

        self.mtp_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        if self.num_mtp_layers > 0:
            mtp_bytes = max_bs * opts.num_qo_heads * opts.head_dim * 4 * 64
            self.mtp_workspace = torch.zeros(mtp_bytes, dtype=torch.uint8, device=device)  # ok: FC106
            self.mtp_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.mtp_workspace, self._kv_layout, **{**self.decode_kw, "backend": "fa2"}
            )

        self.jit_ready = hasattr(self.decode_wrapper, "_cached_module")  # expect: FC103
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    # ------------------------------------------------------------------ graph state

    def init_cuda_graph_state(self, batch_sizes) -> None:
        max_bs = max(batch_sizes)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(max_bs * self.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        graph_ws = kind_workspace("decode", self.device)
        graph_kw = {**self.decode_kw, "use_cuda_graph": True}
        for bs in batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                graph_ws,
                self._kv_layout,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.last_page_len[:bs],
                **graph_kw,
            )
        self.last_page_len.fill_(1)  # ok: FC104

    # ------------------------------------------------------------------ per-step planning

    def prepare(self, meta: FlashInferAttentionMetadata) -> None:
        assert self.decode_wrapper is not None  # ok: FC109
        if meta.num_prefills > 0:
            self._plan_prefill(meta)
        if meta.num_decodes > 0:
            plan_kw = {
                **self._decode_plan_defaults,
                "indptr": meta.kv_indptr_gpu,
                "indices": meta.kv_indices,
                "last_page_len": meta.kv_last_page_len_cpu,
            }
            self.decode_wrapper.plan(**plan_kw)  # expect: FC102
            self._plan_info = plan_kw  # ok: FC103
            if self.window_wrapper is not None:
                window_kw = {**plan_kw, "indptr": meta.kv_indptr_cpu, "window_left": self.opts.sliding_window}
                self.window_wrapper.plan(**window_kw)  # ok: FC102
            if meta.max_seq_len > self.graph_max_seq_len:
                self.tail_wrapper.plan(
                    meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu,
                    **self._decode_plan_defaults,
                )
        if self.mtp_wrapper is not None:
            self.plan_mtp(meta)

    def _plan_prefill(self, meta: FlashInferAttentionMetadata) -> None:
        self.ragged_wrapper.plan(  # ok: FC102
            qo_indptr=meta.qo_indptr_cpu,
            kv_indptr=meta.qo_indptr_cpu,
            num_qo_heads=self.opts.num_qo_heads,
            num_kv_heads=self.opts.num_kv_heads,
            head_dim_qk=self.opts.head_dim,
            q_data_type=self.q_dtype,
            **self.prefill_plan_kw,
        )
        self.prefill_wrapper.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.kv_last_page_len_cpu,
            self.opts.num_qo_heads,
            self.opts.num_kv_heads,
            self.opts.head_dim,
            self.opts.page_size,
            **self.prefill_plan_kw,
        )

    def plan_shared_prefix(self, qo_indptr_cpu, prefix_indptr_cpu, prefix_indices, prefix_last_page_cpu) -> None:
        self.prefix_wrapper.plan(
            qo_indptr_cpu, prefix_indptr_cpu, prefix_indices, prefix_last_page_cpu,
            self.opts.num_qo_heads, self.opts.num_kv_heads, self.opts.head_dim, self.opts.page_size,
            causal=False,
        )

    def plan_mtp(self, meta: FlashInferAttentionMetadata) -> None:
        mtp_kw = dict(self._decode_plan_defaults, last_page_len=meta.kv_last_page_len_gpu)
        self.mtp_wrapper.plan(meta.kv_indptr_cpu, meta.kv_indices, **mtp_kw)  # expect: FC102

    def prepare_cuda_graph(self, meta: FlashInferAttentionMetadata, bs: int) -> None:
        """Fill the graph-bound buffers of batch size ``bs`` and plan its wrapper (before every replay)."""
        n = meta.num_decodes
        nnz = meta.num_kv_pages
        self.kv_indptr_host[: n + 1].copy_(meta.kv_indptr_cpu[: n + 1])
        self.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.last_page_host[:n].copy_(meta.kv_last_page_len_cpu[:n])
        self.last_page_host[n:bs] = 1
        self.kv_indices[:nnz].copy_(meta.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        graph_kw = {
            **self._decode_plan_defaults,
            "indptr": self.kv_indptr_host[: bs + 1],
            "indices": self.kv_indices[:nnz],
            "last_page_len": self.last_page_host[:bs],
        }
        self.graph_wrappers[bs].plan(**graph_kw)  # ok: FC102
        if self.graph_cfg.get("pad_last_page", True) and bs > n:
            self.last_page_len[n:bs].fill_(self.opts.page_size)  # expect: FC104
        self.graph_seq_lens[:n].copy_(meta.seq_lens[:n], non_blocking=True)  # ok: FC104

    # ------------------------------------------------------------------ forward

    def forward(self, q, k, v, kv_cache, meta: FlashInferAttentionMetadata, layer_id: int) -> torch.Tensor:
        if meta.num_prefills > 0:
            return self._forward_extend(q, k, v, kv_cache)
        w = self.graph_wrappers[meta.batch_size] if meta.use_graph else self.decode_wrapper
        out, lse = w.run(q, kv_cache, return_lse=True)  # ok: FC108
        if self.window_wrapper is not None and layer_id in self.window_layers:
            out, lse = self.window_wrapper.run(q, kv_cache, return_lse=True)  # expect: FC108
        if self.prefix_wrapper is not None:
            prefix_out, prefix_lse = self.prefix_wrapper.run(q, kv_cache, return_lse=True)  # expect: FC108
            out, lse = merge_state(out, lse, prefix_out, prefix_lse)
        if not meta.use_graph and meta.max_seq_len > self.graph_max_seq_len:
            out = self.tail_wrapper.run(q, kv_cache)  # ok: FC108
        return out

    def _forward_extend(self, q, k, v, kv_cache) -> torch.Tensor:
        o_new, s_new = self.ragged_wrapper.run(q, k, v, return_lse=True)  # ok: FC108
        o_old, s_old = self.prefill_wrapper.run(q, kv_cache, return_lse=True)  # ok: FC108
        out, _ = merge_state(o_new, s_new, o_old, s_old)
        return out

    def forward_mtp(self, q, kv_cache, meta: FlashInferAttentionMetadata) -> torch.Tensor:
        if self.mtp_wrapper is None:
            raise RuntimeError("speculative.num_mtp_layers is 0; no MTP wrapper was built")
        return self.mtp_wrapper.run(q, kv_cache)  # expect: FC108

    # ------------------------------------------------------------------ stats

    def workspace_usage(self) -> Dict[str, int]:
        return {
            "decode": self.decode_workspace.numel(),
            "tail": self.tail_workspace.numel(),
            "ragged": self.ragged_wrapper._float_workspace_buffer.numel(),  # expect: FC103
        }
