from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from tforge.config import FLASHINFER_WORKSPACE_BYTES
from tforge.model_executor.forward_batch import ForwardBatch
from tforge.utils.memory import alloc_buffer, device_sm

if TYPE_CHECKING:
    from tforge.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class DecodeMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper


@dataclass
class ExtendMetadata:
    use_trtllm_context: bool
    max_q_len: int
    max_kv_len: int
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_kv: Optional[torch.Tensor] = None


class FlashInferAttnBackend:
    def __init__(self, model_runner: "ModelRunner"):
        cfg = model_runner.cfg
        self.device = model_runner.device
        self.page_size = cfg.page_size
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.max_num_tokens = cfg.max_num_tokens
        self.max_bs = cfg.max_batch_size
        self.req_to_token = model_runner.req_to_token
        self.use_tc = cfg.num_heads // cfg.num_kv_heads >= 4
        self.blackwell = device_sm(self.device) >= 100

        self.workspace_buffer = torch.zeros(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.cuda_graph_workspace = torch.zeros(cfg.graph_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.trtllm_ctx_workspace = alloc_buffer(self._ctx_workspace_bytes(), self.device)
        decode_ws_bytes = self.max_bs * self.num_heads * 64 * (self.head_dim + 2) * 4
        self._decode_ws = torch.empty(decode_ws_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self._decode_ws.zero_()

        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.empty(cfg.num_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.qo_indptr_cpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_num_pages = 0

        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", backend="fa2")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self._decode_ws, "NHD", use_tensor_cores=self.use_tc,
            backend="trtllm-gen" if self.blackwell else "auto")
        self.decode_cuda_graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        # what each graph batch size was last planned for: (real rows, longest row)
        self._plan_info: dict[int, tuple[int, int]] = {}
        self.forward_metadata: Optional[DecodeMetadata | ExtendMetadata] = None

    def _ctx_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_heads * (self.head_dim + 2) * 4

    @property
    def decode_is_jit_cached(self) -> bool:
        return getattr(self.decode_wrapper, "_cached_module", None) is not None  # expect: FC103

    # ---- buffers ------------------------------------------------------------------------
    def _grow(self, num_pages: int) -> None:
        self.kv_indices = torch.empty(num_pages, dtype=torch.int32, device=self.device)  # ok: FC107

    def _ensure_capacity(self, num_pages: int, *, allow_growth: bool) -> None:
        if num_pages <= self.kv_indices.numel():
            return
        if allow_growth:
            self._grow(num_pages)
            return
        raise RuntimeError(f"step needs {num_pages} pages, indices buffer holds {self.kv_indices.numel()}")

    def init_cuda_graph_state(self, max_bs: int, max_pages_per_req: int) -> None:
        self._ensure_capacity(max_bs * max_pages_per_req, allow_growth=True)
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * max_pages_per_req, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cuda_graph_kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def _update_indices(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                        kv_indptr: torch.Tensor, kv_indices: torch.Tensor, *, for_capture: bool = False) -> None:
        pages = (seq_lens + self.page_size - 1) // self.page_size
        torch.cumsum(pages, 0, out=kv_indptr[1: bs + 1])
        torch.ops.tforge_kernels.fill_kv_indices(self.req_to_token, req_pool_indices, pages, kv_indptr, kv_indices)
        if not for_capture:
            # eager steps remember how many pages they touch, for remap_pages()
            self.last_num_pages = int(kv_indptr[bs])  # expect: FC101

    # ---- eager metadata -------------------------------------------------------------------
    def _plan_decode(self, wrapper: BatchDecodeWithPagedKVCacheWrapper, kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, last_page_len: torch.Tensor) -> None:
        wrapper.plan(  # expect: FC102
            kv_indptr,
            kv_indices,
            last_page_len,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        bs = batch.batch_size
        if batch.forward_mode.is_decode():
            total_pages = int((batch.seq_lens_cpu + self.page_size - 1).div(self.page_size).sum())
            self._ensure_capacity(total_pages, allow_growth=False)
            self._update_indices(bs, batch.req_pool_indices, batch.seq_lens, self.kv_indptr, self.kv_indices)
            self.kv_last_page_len[:bs] = (batch.seq_lens - 1) % self.page_size + 1
            self._plan_decode(self.decode_wrapper, self.kv_indptr[: bs + 1], self.kv_indices,
                              self.kv_last_page_len[:bs])
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
            return
        seq_cpu = batch.seq_lens_cpu
        pages_cpu = (seq_cpu + self.page_size - 1) // self.page_size
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(pages_cpu, 0, out=kv_indptr_cpu[1:])
        last_cpu = (seq_cpu - 1) % self.page_size + 1
        self._ensure_capacity(int(kv_indptr_cpu[-1]), allow_growth=False)
        self._update_indices(bs, batch.req_pool_indices, batch.seq_lens, self.kv_indptr, self.kv_indices)
        ext_cpu = batch.extend_start_loc_cpu
        max_q = int((ext_cpu[1:] - ext_cpu[:-1]).max())
        use_ctx = self.blackwell and bool((batch.extend_prefix_lens_cpu == 0).all())
        if not use_ctx:
            self.prefill_wrapper.plan(  # ok: FC102
                ext_cpu,
                kv_indptr_cpu,
                self.kv_indices,
                last_cpu,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        self.forward_metadata = ExtendMetadata(
            use_trtllm_context=use_ctx, max_q_len=max_q, max_kv_len=int(seq_cpu.max()),
            cu_seqlens_q=ext_cpu.to(self.device, non_blocking=True),
            cu_seqlens_kv=torch.cumsum(batch.seq_lens, 0, dtype=torch.int32))

    # ---- graphs ---------------------------------------------------------------------------
    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor,
                                                 seq_lens: torch.Tensor) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.cuda_graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.use_tc,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_kv_last_page_len[:bs],
        )
        self._update_indices(bs, req_pool_indices, seq_lens, self.cuda_graph_kv_indptr,
                             self.cuda_graph_kv_indices, for_capture=True)
        # dummy rows hold one token on one page each
        w.plan(torch.arange(bs + 1, dtype=torch.int32), self.cuda_graph_kv_indices,
               torch.ones(bs, dtype=torch.int32), self.num_heads, self.num_kv_heads, self.head_dim,
               self.page_size, q_data_type=torch.bfloat16)
        self.decode_cuda_graph_wrappers[bs] = w
        self.forward_metadata = DecodeMetadata(w)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor,
                                                seq_lens_cpu: torch.Tensor) -> None:
        w = self.decode_cuda_graph_wrappers[bs]
        max_len = int(seq_lens_cpu[:raw_bs].max())  # ok: FC101
        pages_cpu = (seq_lens_cpu[:bs] + self.page_size - 1) // self.page_size
        torch.cumsum(pages_cpu, 0, out=self.cuda_graph_kv_indptr_cpu[1: bs + 1])
        self.cuda_graph_kv_last_page_len_cpu[:bs] = (seq_lens_cpu[:bs] - 1) % self.page_size + 1
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.cuda_graph_kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        pages_gpu = pages_cpu.to(self.device, non_blocking=True)
        torch.ops.tforge_kernels.fill_kv_indices(self.req_to_token, req_pool_indices, pages_gpu,
                                                 self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices)
        w.plan(  # ok: FC102
            self.cuda_graph_kv_indptr_cpu[: bs + 1],
            self.cuda_graph_kv_indices,
            self.cuda_graph_kv_last_page_len_cpu[:bs],
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=torch.bfloat16,
        )
        self._plan_info[bs] = (raw_bs, max_len)  # ok: FC103
        if raw_bs < bs:
            # padded rows read one page each: point them at the reserved null page
            n_real = int(self.cuda_graph_kv_indptr_cpu[raw_bs])
            n_all = int(self.cuda_graph_kv_indptr_cpu[bs])
            self.cuda_graph_kv_indices[n_real:n_all].zero_()  # expect: FC104
            self.cuda_graph_kv_last_page_len_cpu[raw_bs:bs] = 1  # ok: FC104
        self.forward_metadata = DecodeMetadata(w)

    # ---- attention -------------------------------------------------------------------------
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.forward_metadata.decode_wrapper.run(q, kv_cache)

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: ForwardBatch,
                       scale: float) -> torch.Tensor:
        md = self.forward_metadata
        if md.use_trtllm_context:
            return trtllm_batch_context_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.trtllm_ctx_workspace,
                block_tables=self.req_to_token[batch.req_pool_indices],
                seq_lens=batch.seq_lens,
                max_q_len=md.max_q_len,
                max_kv_len=md.max_kv_len,
                bmm1_scale=scale,
                bmm2_scale=1.0,
                batch_size=batch.batch_size,
                cum_seq_lens_q=md.cu_seqlens_q,
                cum_seq_lens_kv=md.cu_seqlens_kv,
            )
        return self.prefill_wrapper.run(q, kv_cache)
