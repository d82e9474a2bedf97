"""FlashInfer attention for a VLM: ragged + paged chunked prefill, graph-mode decode, image cross-attention."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import triton
import triton.language as tl
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)

if TYPE_CHECKING:
    from ..model_executor.forward_batch import ForwardBatch
    from ..model_executor.model_runner import ModelRunner


@triton.jit
def create_kv_indices(req_to_token_ptr, req_pool_indices_ptr, lens_ptr, kv_indptr_ptr, kv_indices_ptr, stride: tl.constexpr):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    n = tl.load(lens_ptr + pid)
    for off in range(0, n, 512):
        cols = off + tl.arange(0, 512)
        slot = tl.load(req_to_token_ptr + req * stride + cols, mask=cols < n)
        tl.store(kv_indices_ptr + start + cols, slot, mask=cols < n)


def clamp_pages_(kv_indices: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Slots of evicted image-prefix pages are -1; point them at the padding slot."""
    return kv_indices.clamp_(min=0, max=num_slots - 1)


@dataclass
class DecodeMetadata:
    wrapper: BatchDecodeWithPagedKVCacheWrapper


@dataclass
class ExtendMetadata:
    use_paged: bool


class FlashInferVLMBackend:
    def __init__(self, model_runner: "ModelRunner") -> None:
        args, cfg = model_runner.server_args, model_runner.model_config
        self.device, self.req_to_token = model_runner.device, model_runner.req_to_token
        self.num_qo_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.kv_layout = "HND" if args.is_blackwell else "NHD"
        self.decode_backend = "trtllm-gen" if args.is_blackwell else "fa2"
        n = self.max_bs = args.max_running_requests
        self.workspace = torch.zeros(args.WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        ragged_bytes = args.chunked_prefill_size * self.num_qo_heads * (self.head_dim + 1) * 4
        self.ragged_workspace = torch.empty(ragged_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        # the decode graphs get their own workspace so a prefill plan can never move under them
        self.graph_workspace = torch.empty(n * self.num_qo_heads * 64 * 1024, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self.kv_layout, backend="fa2")
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.workspace, self.kv_layout)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.kv_layout, use_tensor_cores=True)
        # cross-attention to a request's image tokens: the image KV is fixed for the whole request
        self.cross_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.kv_layout, use_tensor_cores=True)
        self.qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.qo_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(args.max_total_tokens, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cpu = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata = None

    def _fill_indices(self, bs, req_pool_indices, lens, lens_cpu, indptr, indptr_cpu, indices) -> None:
        indptr_cpu[0] = 0
        torch.cumsum(lens_cpu[:bs], 0, dtype=torch.int32, out=indptr_cpu[1 : bs + 1])
        indptr[: bs + 1].copy_(indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        create_kv_indices[(bs,)](self.req_to_token, req_pool_indices, lens, indptr, indices, self.req_to_token.shape[1])

    def _plan_decode(self, wrapper, bs: int, indptr_cpu: torch.Tensor, indices: torch.Tensor) -> None:
        wrapper.plan(indptr_cpu[: bs + 1], indices, self.kv_last_page_len_cpu[:bs], self.num_qo_heads, self.num_kv_heads, self.head_dim, 1)

    def init_forward_metadata(self, fb: "ForwardBatch") -> None:
        bs = fb.batch_size
        if fb.forward_mode.is_decode():
            self._fill_indices(bs, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, self.kv_indptr, self.kv_indptr_cpu, self.kv_indices)
            self._plan_decode(self.decode_wrapper, bs, self.kv_indptr_cpu, self.kv_indices)
            if fb.encoder_indptr_cpu is not None:
                self._plan_decode(self.cross_decode_wrapper, bs, fb.encoder_indptr_cpu, fb.encoder_indices)
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
            return
        qo_indptr = self.qo_indptr[: bs + 1]
        qo_indptr[1:] = torch.cumsum(fb.extend_seq_lens, dim=0)
        self.prefill_wrapper_ragged.begin_forward(qo_indptr, qo_indptr, self.num_qo_heads, self.num_kv_heads, self.head_dim, causal=True)  # expect: FC102
        prefix_cpu = torch.tensor(fb.extend_prefix_lens_cpu, dtype=torch.int32)
        use_paged = bool(prefix_cpu.any())
        if use_paged:
            self._fill_indices(bs, fb.req_pool_indices, fb.extend_prefix_lens, prefix_cpu, self.kv_indptr, self.kv_indptr_cpu, self.kv_indices)
            self.qo_indptr_cpu[1 : bs + 1] = torch.from_numpy(np.cumsum(fb.extend_seq_lens_cpu, dtype=np.int32))
            self.prefill_wrapper_paged.begin_forward(  # ok: FC102
                self.qo_indptr_cpu[: bs + 1], self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],
                self.num_qo_heads, self.num_kv_heads, self.head_dim, 1, causal=False,
            )
        self.forward_metadata = ExtendMetadata(use_paged)

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_cpu) -> None:
        self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, self.kv_layout, use_cuda_graph=True, use_tensor_cores=True, backend=self.decode_backend,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_kv_last_page_len[:bs],
        )
        self.init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, seq_lens_cpu)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_cpu) -> None:
        indptr, indptr_cpu, indices = self.cuda_graph_kv_indptr, self.cuda_graph_kv_indptr_cpu, self.cuda_graph_kv_indices
        self._fill_indices(bs, req_pool_indices, seq_lens, seq_lens_cpu, indptr, indptr_cpu, indices)
        self.graph_wrappers[bs].plan(  # ok: FC102
            indptr_cpu[: bs + 1], indices, self.kv_last_page_len_cpu[:bs], self.num_qo_heads, self.num_kv_heads, self.head_dim, 1
        )
        self.forward_metadata = DecodeMetadata(self.graph_wrappers[bs])

    def forward(self, q, k, v, layer, fb: "ForwardBatch") -> torch.Tensor:
        pool = fb.token_to_kv_pool
        if fb.forward_mode.is_decode():
            if layer.is_cross_attention:
                return self.cross_decode_wrapper.run(q, pool.get_cross_kv_buffer(layer.layer_id))  # expect: FC108
            pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
            return self.forward_metadata.wrapper.run(q, pool.get_kv_buffer(layer.layer_id))  # ok: FC108
        pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        o, lse = self.prefill_wrapper_ragged.run_return_lse(q, k, v)
        if self.forward_metadata.use_paged:
            o_prefix, lse_prefix = self.prefill_wrapper_paged.run_return_lse(q, pool.get_kv_buffer(layer.layer_id))
            o, _ = merge_state(o, lse, o_prefix, lse_prefix)
        return o
