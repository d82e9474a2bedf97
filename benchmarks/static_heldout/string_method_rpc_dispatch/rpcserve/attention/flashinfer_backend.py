"""FlashInfer attention backend.

Nothing calls these methods by their Python name: the runner and the graph runner pick a
staging method from ``STAGE_METHODS[mode]``, the model picks a forward from
``FORWARD_METHODS[mode]``, and decode picks a kernel per layer from ``layer_kinds``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from rpcserve_kernels.trtllm_decode import TrtllmDecodeKernel

from ..config import PREFILL_WORKSPACE_BYTES, EngineConfig, decode_workspace_bytes, verify_workspace_bytes
from ..forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# Plan state two wrappers of the same shapes may share instead of planning twice.
SHARED_PLAN_FIELDS = ("_plan_info", "_cached_module")


def _share_plan(src, dst) -> None:
    for name in SHARED_PLAN_FIELDS:
        setattr(dst, name, getattr(src, name))  # expect: FC103


@dataclass
class AttnMetadata:
    mode: str
    batch_size: int
    padded_bs: int
    nnz: int
    max_kv_len: int = 0
    max_q_len: int = 0
    no_prefix: bool = False


class FlashInferBackend:
    FORWARD_METHODS = {"decode": "forward_decode", "extend": "forward_extend", "target_verify": "forward_verify"}
    STAGE_METHODS = {"decode": "_stage_decode", "extend": "_stage_extend", "target_verify": "_stage_verify"}

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self._kv_layout = "NHD"
        self.q_dtype = torch.bfloat16
        self.kv_dtype = torch.bfloat16
        self.split_kv_min_len = 2048
        max_bs = cfg.max_num_seqs
        i32 = dict(dtype=torch.int32, device=device)
        major, _ = torch.cuda.get_device_capability(device)
        self.decode_backend = "trtllm-gen" if major >= 10 else "fa2"

        self.decode_workspace = torch.zeros(decode_workspace_bytes(cfg), dtype=torch.uint8, device=device)  # ok: FC105
        self.window_workspace = torch.empty(cfg.window_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.verify_workspace = torch.empty(verify_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106

        # Device buffers the graph-mode decode wrappers are bound to. kv_indices is sized for a
        # typical step (a chunk of new pages plus 64 pages per request) and grown for long prefixes.
        self.kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.kv_indices = torch.zeros(cfg.max_num_batched_tokens // cfg.page_size + 64 * max_bs, **i32)
        self.kv_last_page_len = torch.ones(max_bs, **i32)
        self.qo_indptr = torch.zeros(max_bs + 1, **i32)
        # Pinned host mirrors: what every plan() reads.
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_np = self.kv_indptr_cpu.numpy()
        self.kv_last_page_len_np = self.kv_last_page_len_cpu.numpy()

        layout = self._kv_layout
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, layout, backend=self.decode_backend)
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, layout, backend="fa2")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, layout)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, layout)
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.verify_workspace, layout)
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.trtllm = TrtllmDecodeKernel(cfg, device) if cfg.decode_kernel == "trtllm" else None

        full_kind = "trtllm" if self.trtllm is not None else "full"
        windowed = set(cfg.sliding_window_layers)
        self.layer_kinds = ["window" if i in windowed else full_kind for i in range(cfg.num_layers)]
        self.has_window_layers = bool(windowed)
        self.window_covers_all = cfg.sliding_window >= cfg.max_model_len
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.k_scale = torch.ones(1, dtype=torch.float32, device=device)
        self.k_scale_float = 1.0
        self.forward_metadata: AttnMetadata | None = None

    # ---- set-up --------------------------------------------------------------------------------

    def allocate_kv_cache(self, num_pages: int) -> None:
        shape = (num_pages, self.page_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
             torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
            for _ in range(self.cfg.num_layers)
        ]

    def load_kv_scales(self, k_scale: torch.Tensor) -> None:
        self.k_scale.copy_(k_scale)
        self.k_scale_float = float(k_scale)  # ok: FC101

    def init_cuda_graph_state(self, batch_sizes: list[int]) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in batch_sizes:
            wrapper = self._make_graph_wrapper(bs)
            if not wrapper.is_cuda_graph_enabled:  # ok: FC103
                raise RuntimeError(f"decode wrapper for bs={bs} is not in CUDA-graph mode")
            self.graph_wrappers[bs] = wrapper

    def _make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        self.kv_indptr[: bs + 1].zero_()  # ok: FC104
        return BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend=self.decode_backend,
        )

    # ---- per-step metadata ---------------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Eager steps: stage the batch for its mode and plan the eager wrappers."""
        stage = getattr(self, self.STAGE_METHODS[fb.mode])
        self.forward_metadata = stage(fb)

    def prepare_graph_inputs(self, bs: int, fb: ForwardBatch) -> None:
        """Graph steps: stage into the buffers bucket ``bs`` is bound to and plan its wrapper."""
        stage = getattr(self, self.STAGE_METHODS[fb.mode])
        wrapper = self.graph_wrappers[bs] if fb.mode == "decode" else None
        self.forward_metadata = stage(fb, wrapper=wrapper, padded_bs=bs)
        if bs > fb.batch_size:
            # padded rows must not read any KV
            self.kv_last_page_len[fb.batch_size : bs].zero_()  # expect: FC104

    def _fill_kv_mirrors(self, fb: ForwardBatch, padded_bs: int) -> int:
        bs = fb.batch_size
        indptr = self.kv_indptr_np
        indptr[0] = 0
        indptr[1 : bs + 1] = fb.num_pages_np.cumsum()
        indptr[bs + 1 : padded_bs + 1] = indptr[bs]
        self.kv_last_page_len_np[:bs] = fb.last_page_len_np
        self.kv_last_page_len_np[bs:padded_bs] = 1
        return int(indptr[padded_bs])

    def _stage_decode(self, fb: ForwardBatch, wrapper=None, padded_bs: int | None = None) -> AttnMetadata:
        bs = fb.batch_size
        pbs = padded_bs or bs
        nnz = self._fill_kv_mirrors(fb, pbs)
        max_kv_len = int(fb.seq_lens.max())  # expect: FC101
        self.kv_indices[:nnz].copy_(fb.page_ids, non_blocking=True)  # ok: FC104
        w = wrapper if wrapper is not None else self.decode_wrapper
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: pbs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_cpu[:pbs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.page_size,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
            disable_split_kv=max_kv_len < self.split_kv_min_len,
        )
        if self.has_window_layers:
            if self.window_covers_all and self.decode_backend == "fa2":
                _share_plan(w, self.window_wrapper)
            else:
                self.window_wrapper.plan(  # ok: FC102
                    self.kv_indptr_cpu[: pbs + 1],
                    self.kv_indices[:nnz],
                    self.kv_last_page_len_cpu[:pbs],
                    self.cfg.num_qo_heads,
                    self.cfg.num_kv_heads,
                    self.cfg.head_dim,
                    self.page_size,
                    window_left=self.cfg.sliding_window - 1,
                    q_data_type=self.q_dtype,
                    kv_data_type=self.kv_dtype,
                )
        return AttnMetadata("decode", bs, pbs, nnz, max_kv_len=max_kv_len)

    def _stage_extend(self, fb: ForwardBatch, wrapper=None, padded_bs: int | None = None) -> AttnMetadata:
        bs = fb.batch_size
        nnz = self._fill_kv_mirrors(fb, bs)
        if nnz > self.kv_indices.numel():
            # shared prefixes repeat pages across requests, so the flattened lists can outgrow the buffer
            self.kv_indices.resize_(nnz)  # expect: FC107
        self.kv_indices[:nnz].copy_(fb.page_ids, non_blocking=True)  # ok: FC104
        max_q_len = int(fb.query_start_loc_cpu.diff().max())  # ok: FC101
        if fb.no_prefix:
            self.ragged_wrapper.plan(  # expect: FC102
                fb.query_start_loc,
                fb.query_start_loc,
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                causal=True,
                q_data_type=self.q_dtype,
            )
        else:
            self.prefill_wrapper.plan(  # expect: FC102
                fb.query_start_loc,
                self.kv_indptr_cpu[: bs + 1],
                self.kv_indices[:nnz],
                self.kv_last_page_len_cpu[:bs],
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.page_size,
                causal=True,
                q_data_type=self.q_dtype,
                kv_data_type=self.kv_dtype,
            )
        return AttnMetadata("extend", bs, bs, nnz, max_q_len=max_q_len, no_prefix=fb.no_prefix)

    def _stage_verify(self, fb: ForwardBatch, wrapper=None, padded_bs: int | None = None) -> AttnMetadata:
        bs = padded_bs or fb.batch_size
        n = self.cfg.tokens_per_decode_req
        nnz = self._fill_kv_mirrors(fb, bs)
        self.kv_indices[:nnz].copy_(fb.page_ids, non_blocking=True)  # ok: FC104
        torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, out=self.qo_indptr[: bs + 1])
        plan_kw = dict(
            qo_indptr=self.qo_indptr[: bs + 1],
            paged_kv_indptr=self.kv_indptr_cpu[: bs + 1],
            paged_kv_indices=self.kv_indices[:nnz],
            paged_kv_last_page_len=self.kv_last_page_len_cpu[:bs],
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim_qk=self.cfg.head_dim,
            page_size=self.page_size,
            causal=True,
            q_data_type=self.q_dtype,
            kv_data_type=self.kv_dtype,
        )
        self.verify_wrapper.plan(**plan_kw)  # expect: FC102
        return AttnMetadata("target_verify", fb.batch_size, bs, nnz, max_q_len=n)

    # ---- forward, by mode and by layer kind ----------------------------------------------------

    def _store_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> None:
        k_cache, v_cache = self.kv_caches[layer_id]
        slots = fb.out_cache_loc[: k.shape[0]]
        k_cache.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim).index_copy_(0, slots, k.to(self.kv_dtype))
        v_cache.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim).index_copy_(0, slots, v.to(self.kv_dtype))

    def forward_decode(self, layer_id: int, q, k, v, fb: ForwardBatch) -> torch.Tensor:
        self._store_kv(layer_id, k, v, fb)
        return getattr(self, f"_{self.layer_kinds[layer_id]}_decode")(layer_id, q, fb)

    def _full_decode(self, layer_id: int, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        wrapper = self.graph_wrappers.get(fb.graph_bs) if fb.use_graph else self.decode_wrapper
        return wrapper.run(q, self.kv_caches[layer_id], k_scale=self.k_scale_float)  # ok: FC108

    def _window_decode(self, layer_id: int, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        bs = fb.batch_size
        # skip the pages that slid out of the window before the kernel walks them
        dropped = torch.clamp(fb.seq_lens - self.cfg.sliding_window, min=0) // self.page_size
        self.kv_indptr[:bs].add_(dropped.to(torch.int32))  # expect: FC104
        return self.window_wrapper.run(q, self.kv_caches[layer_id], k_scale=self.k_scale_float)  # expect: FC108

    def _trtllm_decode(self, layer_id: int, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        bs = fb.graph_bs if fb.use_graph else fb.batch_size
        return self.trtllm.decode(
            q, self.kv_caches[layer_id], fb.block_table[:bs], fb.seq_lens, self.cfg.max_model_len, self.k_scale_float
        )

    def forward_extend(self, layer_id: int, q, k, v, fb: ForwardBatch) -> torch.Tensor:
        self._store_kv(layer_id, k, v, fb)
        if self.forward_metadata.no_prefix:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, self.kv_caches[layer_id], k_scale=self.k_scale_float)  # ok: FC108

    def forward_verify(self, layer_id: int, q, k, v, fb: ForwardBatch) -> torch.Tensor:
        self._store_kv(layer_id, k, v, fb)
        k_scale = float(self.k_scale)  # expect: FC101
        return self.verify_wrapper.run(q, self.kv_caches[layer_id], k_scale=k_scale)  # expect: FC108
