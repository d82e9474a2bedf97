"""FlashInfer backend of the full-attention layers (every fourth layer of Qwen3-Next)."""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional

import torch
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from q3n.schema import FULL_ATTN_DECODE_WORKSPACE_BYTES, EngineLimits, ForwardBatch, Qwen3NextConfig

logger = logging.getLogger(__name__)


@triton.jit
def fill_kv_indices_kernel(req_to_page_ptr, req_pool_indices_ptr, kv_indptr_ptr, kv_indices_ptr, req_to_page_stride: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    end = tl.load(kv_indptr_ptr + pid + 1)
    n = end - start
    for off in range(0, n, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < n
        pages = tl.load(req_to_page_ptr + req * req_to_page_stride + offs, mask=mask)
        tl.store(kv_indices_ptr + start + offs, pages, mask=mask)


@dataclasses.dataclass
class DecodePlanInputs:
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor


@dataclasses.dataclass
class FullAttnMetadata:
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    tokens_per_req: int = 1
    req_pool_indices: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    max_seq_len: int = 0


class FlashInferFullAttnBackend:
    """Paged KV for the full-attention layers; the linear layers keep their state in MambaStatePool."""

    def __init__(self, cfg: Qwen3NextConfig, limits: EngineLimits, req_to_page: torch.Tensor, device: torch.device):
        self.device = device
        self.page_size = limits.page_size
        self.num_qo_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self._heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.sm_scale = cfg.head_dim**-0.5
        self.max_context_len = limits.max_context_len
        self.req_to_page = req_to_page
        self.use_trtllm = limits.use_trtllm_decode
        self._kv_layout = "NHD"
        max_bs = limits.max_running_requests

        full_layers = cfg.full_attention_layers()
        self.layer_to_cache = {layer_id: i for i, layer_id in enumerate(full_layers)}
        cache_shape = (limits.num_pages, limits.page_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k_caches: List[torch.Tensor] = [torch.zeros(cache_shape, dtype=torch.bfloat16, device=device) for _ in full_layers]
        self.v_caches: List[torch.Tensor] = [torch.zeros(cache_shape, dtype=torch.bfloat16, device=device) for _ in full_layers]

        prefill_bytes = limits.max_num_tokens * cfg.num_attention_heads * cfg.head_dim * 2
        self.prefill_workspace = torch.empty(prefill_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        verify_tokens = max_bs * (limits.num_speculative_tokens + 1)
        self.verify_workspace = torch.zeros(verify_tokens * cfg.num_attention_heads * cfg.head_dim * 8, dtype=torch.uint8, device=device)  # ok: FC106
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.verify_workspace, self._kv_layout, backend="fa2")
        self.decode_workspace = torch.zeros(FULL_ATTN_DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
        self.trtllm_workspace: Optional[torch.Tensor] = None
        if self.use_trtllm:
            self.trtllm_workspace = torch.empty(max_bs * cfg.num_attention_heads * 128 * 1024, dtype=torch.uint8, device=device)  # expect: FC105

        # Decode page table; the graph wrappers bind slices of these at capture time.
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(limits.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        # Host mirrors handed to plan().
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[FullAttnMetadata] = None

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self, max_bs: int) -> None:
        # Padded rows keep one valid token until their first replay plans them.
        self.kv_last_page_len[:max_bs].fill_(1)  # ok: FC104

    def _num_pages_cpu(self, seq_lens_cpu: torch.Tensor) -> torch.Tensor:
        return (seq_lens_cpu + self.page_size - 1) // self.page_size

    # ------------------------------------------------------------------ eager
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            self._init_decode_metadata(fb)
        else:
            self._init_extend_metadata(fb)

    def _init_decode_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        seq_lens_cpu = fb.seq_lens_cpu
        num_pages = (fb.seq_lens + self.page_size - 1) // self.page_size
        self.kv_indptr[1 : bs + 1] = torch.cumsum(num_pages, dim=0)  # ok: FC104
        fill_kv_indices_kernel[(bs,)](self.req_to_page, fb.req_pool_indices, self.kv_indptr, self.kv_indices, self.req_to_page.stride(0), BLOCK=128)
        self.kv_last_page_len_cpu[:bs] = (seq_lens_cpu - 1) % self.page_size + 1
        inputs = DecodePlanInputs(indptr=self.kv_indptr[: bs + 1], indices=self.kv_indices, last_page_len=self.kv_last_page_len_cpu[:bs])
        self._plan_decode(self.decode_wrapper, inputs)
        max_seq_len = int(seq_lens_cpu.max())  # ok: FC101
        self.forward_metadata = FullAttnMetadata(
            decode_wrapper=self.decode_wrapper, req_pool_indices=fb.req_pool_indices, seq_lens=fb.seq_lens, max_seq_len=max_seq_len
        )

    def _plan_decode(self, wrapper: BatchDecodeWithPagedKVCacheWrapper, inp: DecodePlanInputs) -> None:
        wrapper.plan(  # expect: FC102
            inp.indptr, inp.indices, inp.last_page_len, *self._heads, self.page_size, q_data_type=torch.bfloat16
        )

    def _init_extend_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        qo_indptr = self.qo_indptr[: bs + 1]
        torch.cumsum(fb.extend_seq_lens, dim=0, out=qo_indptr[1:])
        num_pages = (fb.seq_lens + self.page_size - 1) // self.page_size
        torch.cumsum(num_pages, dim=0, out=self.kv_indptr[1 : bs + 1])
        fill_kv_indices_kernel[(bs,)](self.req_to_page, fb.req_pool_indices, self.kv_indptr, self.kv_indices, self.req_to_page.stride(0), BLOCK=128)
        kv_indptr_cpu = self.kv_indptr_cpu[: bs + 1]
        kv_indptr_cpu[1:] = torch.cumsum(self._num_pages_cpu(fb.seq_lens_cpu), dim=0)
        self.kv_last_page_len_cpu[:bs] = (fb.seq_lens_cpu - 1) % self.page_size + 1
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr, kv_indptr_cpu, self.kv_indices, self.kv_last_page_len_cpu[:bs], *self._heads, self.page_size,
            causal=True, sm_scale=self.sm_scale, q_data_type=torch.bfloat16,
        )
        self.forward_metadata = FullAttnMetadata(prefill_wrapper=self.prefill_wrapper)

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, tokens_per_req: int
    ) -> None:
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        if tokens_per_req > 1:
            # MTP verify: every request carries tokens_per_req query rows
            qo_indptr_cpu = torch.arange(0, (bs + 1) * tokens_per_req, tokens_per_req, dtype=torch.int32)
            self.verify_wrapper.plan(  # ok: FC102
                qo_indptr_cpu, self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],
                *self._heads, self.page_size, causal=True, sm_scale=self.sm_scale,
            )
            self.forward_metadata = FullAttnMetadata(prefill_wrapper=self.verify_wrapper, tokens_per_req=tokens_per_req)
            return
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_decode_wrappers[bs] = wrapper
        wrapper.plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self._heads, self.page_size,
            q_data_type=torch.bfloat16,
        )
        self.forward_metadata = FullAttnMetadata(
            decode_wrapper=wrapper, req_pool_indices=req_pool_indices, seq_lens=seq_lens, max_seq_len=self.max_context_len
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor, tokens_per_req: int
    ) -> None:
        num_pages_cpu = self._num_pages_cpu(seq_lens_cpu[:raw_bs])
        self.kv_indptr_cpu[1 : raw_bs + 1] = torch.cumsum(num_pages_cpu, dim=0)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs] = (seq_lens_cpu[:raw_bs] - 1) % self.page_size + 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        fill_kv_indices_kernel[(raw_bs,)](self.req_to_page, req_pool_indices, self.kv_indptr, self.kv_indices, self.req_to_page.stride(0), BLOCK=128)
        if tokens_per_req > 1:
            qo_indptr_cpu = torch.arange(0, (bs + 1) * tokens_per_req, tokens_per_req, dtype=torch.int32)
            self.verify_wrapper.plan(
                qo_indptr_cpu, self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],
                *self._heads, self.page_size, causal=True, sm_scale=self.sm_scale,
            )
            return
        wrapper = self.graph_decode_wrappers[bs]
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self._heads, self.page_size,
            q_data_type=torch.bfloat16,
        )
        # padded rows: one token of the padding request
        self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104

    # ------------------------------------------------------------------ kernels
    def save_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_cache_loc: torch.Tensor) -> None:
        idx = self.layer_to_cache[layer_id]
        loc = out_cache_loc.long()
        self.k_caches[idx].view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, loc, k)
        self.v_caches[idx].view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, loc, v)

    def forward_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        md = self.forward_metadata
        idx = self.layer_to_cache[layer_id]
        kv = (self.k_caches[idx], self.v_caches[idx])
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        if md.tokens_per_req > 1:
            return self.verify_wrapper.run(q, kv)  # expect: FC108
        if self.use_trtllm:
            block_tables = self.req_to_page[md.req_pool_indices.long()]
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.trtllm_workspace, block_tables, md.seq_lens, md.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0
            )
        return md.decode_wrapper.run(q, kv)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        md = self.forward_metadata
        idx = self.layer_to_cache[layer_id]
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        return md.prefill_wrapper.run(q, (self.k_caches[idx], self.v_caches[idx]))
