"""trtllm-gen attention backend for Blackwell (attention_backend = "trtllm").

Decode calls ``trtllm_batch_decode_with_kv_cache`` directly on the block table: there is
no planner, so a captured decode graph only needs static ``seq_lens`` and block tables.
Extend steps use an FA2 paged prefill wrapper.
"""
from __future__ import annotations

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

import lazyserve.config as lcfg

from ...batch import ForwardBatch
from ...config import EngineConfig
from ...utils import buffers as ws_buffers
from ...utils import device_i32, fill_kv_indices, pinned_i32
from .backend import allocate_kv_cache
from .plan import PlanDims


class TrtllmDecodeBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self._kv_layout = "HND"
        self.dims = PlanDims(cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self.sm_scale = cfg.head_dim**-0.5
        self.kv_cache = allocate_kv_cache(cfg, device, self._kv_layout)
        self.k_scale = torch.ones(cfg.num_pages, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(cfg.num_pages, dtype=torch.float32, device=device)

        self.workspace = torch.empty(lcfg.TRTLLM_WORKSPACE_MB << 20, dtype=torch.uint8, device=device)  # expect: FC105, FC106
        self.prefill_workspace = torch.empty(ws_buffers.EXTEND_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # ok: FC105, FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)

        max_bs = cfg.max_batch_size
        self.kv_indptr = device_i32(max_bs + 1, device)
        self.kv_indices = device_i32(cfg.num_pages, device)
        self.kv_indices_host = pinned_i32(cfg.num_pages)
        self.kv_last_page_len_host = pinned_i32(max_bs)

        # CUDA-graph state
        self.block_tables = None
        self.pad_block_rows = None

    # ------------------------------------------------------------------ eager
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            return  # trtllm-gen decode reads the block table directly
        bs = fb.batch_size
        seq_lens_np = fb.seq_lens_cpu.numpy()[:bs]
        total = fill_kv_indices(fb.page_table_np, seq_lens_np, self.page_size, self.kv_indices_host.numpy())
        self.kv_indices[:total].copy_(self.kv_indices_host[:total], non_blocking=True)
        self.kv_last_page_len_host.numpy()[:bs] = (seq_lens_np - 1) % self.page_size + 1

        pages = torch.div(fb.seq_lens + self.page_size - 1, self.page_size, rounding_mode="floor")
        kv_indptr = self.kv_indptr[: bs + 1]
        torch.cumsum(pages, 0, dtype=torch.int32, out=kv_indptr[1:])
        self.prefill_wrapper.plan(  # expect: FC102
            fb.qo_indptr_cpu,
            kv_indptr,
            self.kv_indices[:total],
            self.kv_last_page_len_host[:bs],
            self.dims.num_qo_heads,
            self.dims.num_kv_heads,
            self.dims.head_dim,
            self.page_size,
            causal=True,
            q_data_type=self.dims.q_dtype,
        )

    def _block_tables(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.graph_bs is not None:
            return self.block_tables[: fb.graph_bs]
        # trim the block table to the longest request: a narrower stride for the kernel
        max_pages = (fb.seq_lens.max() + self.page_size - 1) // self.page_size
        return fb.page_table[:, :max_pages]  # expect: FC101

    def forward_decode(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        page = torch.div(fb.out_cache_loc, self.page_size, rounding_mode="floor")
        slot = fb.out_cache_loc % self.page_size
        kv[page, 0, :, slot] = k
        kv[page, 1, :, slot] = v
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv,
            workspace_buffer=self.workspace,
            block_tables=self._block_tables(fb),
            seq_lens=fb.seq_lens,
            max_seq_len=self.cfg.max_context_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_extend(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        page = torch.div(fb.out_cache_loc, self.page_size, rounding_mode="floor")
        slot = fb.out_cache_loc % self.page_size
        kv[page, 0, :, slot] = k
        kv[page, 1, :, slot] = v
        return self.prefill_wrapper.run(q, kv)

    # ------------------------------------------------------------ CUDA graphs
    def init_cuda_graph_state(self, max_bs: int) -> None:
        width = self.cfg.max_pages_per_seq()
        self.block_tables = torch.zeros(max_bs, width, dtype=torch.int32, device=self.device)
        self.pad_block_rows = torch.zeros(max_bs, width, dtype=torch.int32, device=self.device)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        fb.graph_bs = bs

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        raw_bs = fb.batch_size
        self.block_tables = torch.cat([fb.page_table, self.pad_block_rows[: bs - raw_bs]], dim=0)  # expect: FC107


BACKEND_CLS = TrtllmDecodeBackend
