"""Attention with an FP8 KV cache and per-head scales, dispatched per layer between fp8 and bf16.

FlashInfer takes one scale per call, so the per-head K scales are folded into q (q . (k8 * s) =
(q * s) . k8, broadcast over each GQA group) and the per-head V scales into the output.
Long contexts go to trtllm-gen with the scales as bmm scalars.
"""

from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from fp8kv.cache import Fp8PagedKVCache
from fp8kv.config import Fp8ServeConfig, KVDtype
from fp8kv.scales import HeadScales, ScaleTracker
from fp8_attn.metadata import DecodeMeta, GraphBuffers, PrefillMeta
from fp8_attn.workspaces import trtllm_decode_workspace, trtllm_prefill_workspace


class Fp8DispatchBackend:
    def __init__(
        self, cfg: Fp8ServeConfig, cache: Fp8PagedKVCache, scales: HeadScales, tracker: ScaleTracker, device
    ):
        self.cfg = cfg
        self.cache = cache
        self.scales = scales
        self.tracker = tracker
        self.device = device
        layout = self.cache._kv_layout  # ok: FC103
        self.layout = layout
        self.layer_dtype = [cfg.kv_dtype(i) for i in range(cfg.num_layers)]
        self.sm_scale = cfg.head_dim**-0.5

        self.decode_workspaces = {dt: torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device) for dt in KVDtype}  # ok: FC106
        self.eager_decode = {
            KVDtype.FP8: BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspaces[KVDtype.FP8], layout, use_tensor_cores=True
            ),
            KVDtype.BF16: BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspaces[KVDtype.BF16], layout, use_tensor_cores=True
            ),
        }
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_bf16 = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, layout, backend="fa2")
        self.prefill_fp8 = BatchPrefillWithPagedKVCacheWrapper(
            trtllm_prefill_workspace(cfg.prefill_workspace_bytes(), device), layout, backend="trtllm-gen"
        )
        self.trtllm_decode_ws = trtllm_decode_workspace(cfg.trtllm_workspace_bytes, device)

        max_bs = max(cfg.decode_buckets)
        self.graph_bufs = GraphBuffers(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device),
            last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
            kv_indptr_cpu=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
            last_page_len_cpu=torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
        )
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.slot_mapping = torch.zeros(max(max_bs, cfg.chunked_prefill_size), dtype=torch.int64, device=device)
        self._dispatch = {KVDtype.FP8: self._decode_fp8, KVDtype.BF16: self._decode_bf16}
        self.md: Optional[DecodeMeta] = None
        self.pm: Optional[PrefillMeta] = None
        self.bmm1_scales: List[float] = [self.sm_scale] * cfg.num_layers
        self.bmm2_scales: List[float] = [1.0] * cfg.num_layers
        self.bmm_scales_stale = True

    # ------------------------------------------------------------------ set-up
    def init_graph_wrappers(self, workspace: torch.Tensor) -> None:
        gb = self.graph_bufs
        for bs in self.cfg.decode_buckets:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                workspace,
                self.layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=gb.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=gb.kv_indices,
                paged_kv_last_page_len_buffer=gb.last_page_len[:bs],
            )

    def warmup_kernels(self) -> None:
        """JIT-compile every decode variant once, before any graph is captured."""
        for dt, w in self.eager_decode.items():
            if w._kv_layout != self.cache.kv_layout:  # expect: FC103
                raise RuntimeError(f"{dt.value} decode wrapper was built for another KV layout")
        for bs, w in self.graph_decode.items():
            if getattr(w, "_cached_module", None) is not None:  # expect: FC103
                continue
            self._warm_one(w, bs)

    def _warm_one(self, w: BatchDecodeWithPagedKVCacheWrapper, bs: int) -> None:
        w.plan(
            torch.arange(bs + 1, dtype=torch.int32),
            self.graph_bufs.kv_indices,
            torch.ones(bs, dtype=torch.int32),
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.float8_e4m3fn,
        )

    # ------------------------------------------------------------------ eager decode
    def init_forward_metadata(self, md: DecodeMeta) -> None:
        self.md = md
        self.pm = None
        self.slot_mapping[: md.batch_size].copy_(md.slot_mapping, non_blocking=True)
        if self.bmm_scales_stale:
            self._refresh_bmm_scales()
            self.bmm_scales_stale = False
        for dt, w in self.eager_decode.items():
            w.plan(  # ok: FC102
                md.kv_indptr_cpu,
                md.kv_indices,
                md.last_page_len_cpu,
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
                q_data_type=torch.bfloat16,
                kv_data_type=dt.torch_dtype,
                sm_scale=self.sm_scale,
            )

    def _refresh_bmm_scales(self) -> None:
        self.bmm1_scales = [float(ks.max()) * self.sm_scale for ks in self.scales.k_scale]  # expect: FC101
        self.bmm2_scales = [float(vs) for vs in self.scales.v_scale_np.max(axis=1)]  # ok: FC101

    # ------------------------------------------------------------------ prefill
    def init_forward_metadata_prefill(self, pm: PrefillMeta) -> None:
        self.pm = pm
        self.md = None
        self.slot_mapping[: pm.num_tokens].copy_(pm.slot_mapping, non_blocking=True)
        self._plan_prefill(self.prefill_fp8, pm, KVDtype.FP8)
        self._plan_prefill(self.prefill_bf16, pm, KVDtype.BF16)

    def _plan_prefill(self, w: BatchPrefillWithPagedKVCacheWrapper, pm: PrefillMeta, kv_dtype: KVDtype) -> None:
        w.plan(  # expect: FC102
            pm.qo_indptr,
            pm.kv_indptr_cpu,
            pm.kv_indices,
            pm.last_page_len_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
            kv_data_type=kv_dtype.torch_dtype,
            sm_scale=self.sm_scale,
        )

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, md: DecodeMeta) -> None:
        self.md = md
        gb = self.graph_bufs
        gb.kv_indptr_cpu[: bs + 1].copy_(md.kv_indptr_cpu)
        gb.last_page_len_cpu[:bs] = 1
        self.graph_decode[bs].plan(
            gb.kv_indptr_cpu[: bs + 1],
            gb.kv_indices,
            gb.last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.float8_e4m3fn,
            sm_scale=self.sm_scale,
        )
        self.eager_decode[KVDtype.BF16].plan(
            md.kv_indptr_cpu,
            md.kv_indices,
            md.last_page_len_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
            sm_scale=self.sm_scale,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, md: DecodeMeta) -> None:
        n = md.batch_size
        self.md = md
        gb = self.graph_bufs
        nnz = int(md.kv_indptr_cpu[n])
        gb.kv_indptr_cpu[: n + 1].copy_(md.kv_indptr_cpu[: n + 1])
        # each padding row reads one page: the null page
        gb.kv_indptr_cpu[n + 1 : bs + 1] = torch.arange(nnz + 1, nnz + bs - n + 1, dtype=torch.int32)
        gb.last_page_len_cpu[:n].copy_(md.last_page_len_cpu[:n])
        gb.last_page_len_cpu[n:bs] = 1
        gb.kv_indices[:nnz].copy_(md.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self.slot_mapping[:n].copy_(md.slot_mapping, non_blocking=True)
        self.slot_mapping[n:bs].zero_()
        self.graph_decode[bs].plan(  # ok: FC102
            gb.kv_indptr_cpu[: bs + 1],
            gb.kv_indices,
            gb.last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.float8_e4m3fn,
            sm_scale=self.sm_scale,
        )
        gb.kv_indices[nnz : nnz + bs - n].zero_()  # expect: FC104

    # ------------------------------------------------------------------ forward
    def _k_fold(self, layer: int) -> torch.Tensor:
        g = self.cfg.gqa_group
        return self.scales.k_scale[layer].view(-1, 1).expand(-1, g).reshape(1, -1, 1)

    def _v_fold(self, layer: int) -> torch.Tensor:
        g = self.cfg.gqa_group
        return self.scales.v_scale[layer].view(-1, 1).expand(-1, g).reshape(1, -1, 1)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.write(
            layer,
            k,
            v,
            self.slot_mapping[: k.shape[0]],
            self.scales.k_scale[layer],
            self.scales.v_scale[layer],
            self.tracker.current_amax(layer),
        )

    def decode_attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self._dispatch[self.layer_dtype[layer]](layer, q)

    def _decode_bf16(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.eager_decode[KVDtype.BF16].run(q, self.cache.layer_cache(layer))  # expect: FC108

    def _decode_fp8(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        md = self.md
        kv = self.cache.layer_cache(layer)
        if md.max_seq_len > self.cfg.long_context_threshold:
            return trtllm_batch_decode_with_kv_cache(
                q,
                kv,
                self.trtllm_decode_ws,
                md.block_tables,
                md.seq_lens,
                md.max_seq_len,
                bmm1_scale=self.bmm1_scales[layer],
                bmm2_scale=self.bmm2_scales[layer],
            )
        qs = (q * self._k_fold(layer)).to(q.dtype)
        w = self.graph_decode[md.graph_bs] if md.graph_bs is not None else self.eager_decode[KVDtype.FP8]
        out = w.run(qs, kv)  # ok: FC108
        return (out * self._v_fold(layer)).to(q.dtype)

    def prefill_attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kv = self.cache.layer_cache(layer)
        if self.layer_dtype[layer] is KVDtype.BF16:
            return self.prefill_bf16.run(q, kv)
        qs = (q * self._k_fold(layer)).to(q.dtype)
        return (self.prefill_fp8.run(qs, kv) * self._v_fold(layer)).to(q.dtype)
