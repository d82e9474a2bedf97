"""FlashInfer backend for the full-attention (and sliding-window) layers of a hybrid model."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

import torch
import triton
import triton.language as tl
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.cascade import merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from srt.configs.hybrid_config import SWA_WORKSPACE_BYTES, HybridLayerConfig, ServerArgs
from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from srt.model_executor.model_runner import ModelRunner

_global_workspace: Optional[torch.Tensor] = None


def _workspace_bytes(args: ServerArgs, cfg: HybridLayerConfig) -> int:
    # split-k partial outputs + lse for the largest step the scheduler can build
    tokens = max(args.chunked_prefill_size, args.max_running_requests)
    return tokens * cfg.num_attention_heads * (cfg.head_dim + 1) * 4 * 8 + (8 << 20)


def get_flashinfer_workspace(args: ServerArgs, cfg: HybridLayerConfig, device) -> torch.Tensor:
    global _global_workspace
    if _global_workspace is None:
        _global_workspace = torch.zeros(_workspace_bytes(args, cfg), dtype=torch.uint8, device=device)  # ok: FC106
    return _global_workspace


@triton.jit
def fill_kv_indices_kernel(
    req_to_token,
    req_pool_indices,
    kv_lens,
    kv_indptr,
    kv_indices,
    req_to_token_stride: tl.constexpr,
    BLOCK: tl.constexpr = 256,
):
    row = tl.program_id(0)
    req = tl.load(req_pool_indices + row)
    dst = tl.load(kv_indptr + row)
    n = tl.load(kv_lens + row).to(tl.int32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        tok = tl.load(req_to_token + req * req_to_token_stride + offs, mask=m)
        tl.store(kv_indices + dst + offs, tok, mask=m)


class AttentionBackend(abc.ABC):
    @abc.abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None: ...

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
        raise NotImplementedError

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1


@dataclass
class DecodeMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper


@dataclass
class PrefillMetadata:
    use_ragged: bool
    extend_no_prefix: bool


class FlashInferAttnBackend(AttentionBackend):
    def __init__(self, model_runner: "ModelRunner", layer_ids: List[int]):
        cfg = model_runner.model_config
        args = model_runner.server_args
        self.device = model_runner.device
        self.layer_ids = layer_ids
        self.num_qo_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scaling = cfg.head_dim**-0.5
        self.sliding_window = cfg.sliding_window
        self.page_size = args.page_size
        self.max_bs = args.max_running_requests
        self.max_context_len = args.context_length
        self.req_to_token = model_runner.req_to_token
        self.kv_pool = model_runner.kv_pool
        self._kv_layout = "NHD"  # ok: FC103
        self.decode_use_tensor_cores = self.num_qo_heads // self.num_kv_heads >= 4

        self.workspace_buffer = get_flashinfer_workspace(args, cfg, self.device)
        self.swa_workspace = torch.zeros(SWA_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106

        self.kv_indptr = torch.zeros((self.max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones((self.max_bs,), dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.zeros((self.max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros((self.max_bs + 1,), dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones((self.max_bs,), dtype=torch.int32, pin_memory=True)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer, self._kv_layout, use_tensor_cores=self.decode_use_tensor_cores
        )
        self.swa_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.swa_workspace, self._kv_layout, use_tensor_cores=self.decode_use_tensor_cores
        )
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, self._kv_layout)
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.workspace_buffer, self._kv_layout)
        self.decode_cuda_graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata = None

        self.use_trtllm_decode = args.decode_attention_backend == "trtllm_mha"
        self.max_seq_len_decode = self.max_context_len
        if self.use_trtllm_decode:
            # trtllm-gen keeps its multi-CTA counters in here
            self.trtllm_workspace = torch.empty(self._trtllm_workspace_bytes(args), dtype=torch.uint8, device=self.device)  # expect: FC105
            self.page_table = torch.zeros(
                (self.max_bs, self.max_context_len // self.page_size), dtype=torch.int32, device=self.device
            )

    def _trtllm_workspace_bytes(self, args: ServerArgs) -> int:
        return args.max_running_requests * self.num_qo_heads * (self.head_dim + 2) * 4 * 16 + (4 << 20)

    # ---- graph state -------------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros(
            (max_bs * self.max_context_len // self.page_size,), dtype=torch.int32, device=self.device
        )
        self.cuda_graph_seq_lens_cpu = torch.zeros((max_bs,), dtype=torch.int32)
        self.kv_last_page_len.fill_(1)  # ok: FC104

    # ---- per-step metadata -------------------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        bs = forward_batch.batch_size
        if forward_batch.forward_mode.is_decode():
            if self.use_trtllm_decode:
                self._fill_page_table(forward_batch.req_pool_indices, bs)
                self.max_seq_len_decode = int(forward_batch.seq_lens_cpu.max())  # ok: FC101
                self.forward_metadata = DecodeMetadata(self.decode_wrapper)
                return
            kv_indices = torch.empty(forward_batch.seq_lens_sum, dtype=torch.int32, device=self.device)
            self._update_decode_indices(
                self.decode_wrapper, forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.seq_lens_cpu, bs, kv_indices
            )
            if self.sliding_window > 0:
                self._update_decode_indices(
                    self.swa_decode_wrapper,
                    forward_batch.req_pool_indices,
                    forward_batch.seq_lens,
                    forward_batch.seq_lens_cpu,
                    bs,
                    kv_indices,
                    window_left=self.sliding_window - 1,
                )
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
        else:
            self._init_extend_metadata(forward_batch)

    def _fill_page_table(self, req_pool_indices: torch.Tensor, bs: int) -> None:
        self.page_table[:bs].copy_(self.req_to_token[req_pool_indices, :: self.page_size] // self.page_size)

    def _init_extend_metadata(self, forward_batch: ForwardBatch) -> None:
        bs = forward_batch.batch_size
        prefix_lens = forward_batch.extend_prefix_lens
        qo_indptr = self.qo_indptr[: bs + 1]
        qo_indptr[1:] = torch.cumsum(forward_batch.extend_seq_lens, dim=0)
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(prefix_lens, dim=0)  # ok: FC104
        kv_indices = torch.empty(sum(forward_batch.extend_prefix_lens_cpu), dtype=torch.int32, device=self.device)  # ok: FC101
        fill_kv_indices_kernel[(bs,)](
            self.req_to_token, forward_batch.req_pool_indices, prefix_lens, kv_indptr, kv_indices, self.req_to_token.shape[1]
        )
        self.prefill_wrapper_ragged.begin_forward(  # expect: FC102
            qo_indptr,
            qo_indptr,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            causal=True,
        )
        self.prefill_wrapper_paged.plan(  # expect: FC102
            qo_indptr,
            kv_indptr,
            kv_indices,
            self.kv_last_page_len[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=False,
        )
        self.forward_metadata = PrefillMetadata(use_ragged=True, extend_no_prefix=False)

    def _update_decode_indices(self, wrapper, req_pool_indices, seq_lens, seq_lens_cpu, bs, kv_indices, window_left=-1):
        kv_indptr = self.kv_indptr
        torch.cumsum(seq_lens[:bs], dim=0, out=kv_indptr[1 : bs + 1])  # ok: FC104
        fill_kv_indices_kernel[(bs,)](  # ok: FC104
            self.req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, self.req_to_token.shape[1]
        )
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(seq_lens_cpu[:bs], dim=0)
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            window_left=window_left,
            non_blocking=True,
        )

    # ---- CUDA graphs -------------------------------------------------------------------------------------

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
        if self.use_trtllm_decode:
            self._fill_page_table(req_pool_indices, bs)
            self.max_seq_len_decode = int(seq_lens.max())  # expect: FC101
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
            return
        decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=self.decode_use_tensor_cores,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        seq_lens_cpu = self.cuda_graph_seq_lens_cpu[:bs]
        seq_lens_cpu.fill_(self.get_cuda_graph_seq_len_fill_value())
        self._update_decode_indices(decode_wrapper, req_pool_indices, seq_lens, seq_lens_cpu, bs, self.cuda_graph_kv_indices)
        self.decode_cuda_graph_wrappers[bs] = decode_wrapper
        self.forward_metadata = DecodeMetadata(decode_wrapper)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu):
        if self.use_trtllm_decode:
            self._fill_page_table(req_pool_indices[:bs], bs)
            return
        self._update_decode_indices(
            self.decode_cuda_graph_wrappers[bs], req_pool_indices[:bs], seq_lens[:bs], seq_lens_cpu[:bs], bs, self.cuda_graph_kv_indices
        )
        if self.sliding_window > 0:
            self._update_decode_indices(
                self.swa_decode_wrapper,
                req_pool_indices[:bs],
                seq_lens[:bs],
                seq_lens_cpu[:bs],
                bs,
                self.cuda_graph_kv_indices,
                window_left=self.sliding_window - 1,
            )
        self.forward_metadata = DecodeMetadata(self.decode_cuda_graph_wrappers[bs])

    # ---- kernels -----------------------------------------------------------------------------------------

    def forward(self, q, k, v, layer_id: int, forward_batch: ForwardBatch, sliding: bool = False):
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer_id, forward_batch, sliding)
        return self.forward_extend(q, k, v, layer_id, forward_batch)

    def forward_decode(self, q, k, v, layer_id, forward_batch: ForwardBatch, sliding: bool = False):
        self.kv_pool.set_kv(layer_id, forward_batch.out_cache_loc, k, v)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        kv = self.kv_pool.get_kv(layer_id)
        if self.use_trtllm_decode:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trtllm_workspace,
                block_tables=self.page_table[: forward_batch.batch_size],
                seq_lens=forward_batch.seq_lens,
                max_seq_len=self.max_seq_len_decode,
                bmm1_scale=self.scaling,
                bmm2_scale=1.0,
            )
        if sliding:
            return self.swa_decode_wrapper.run(q, kv)  # expect: FC108
        return self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108

    def forward_extend(self, q, k, v, layer_id, forward_batch: ForwardBatch):
        self.kv_pool.set_kv(layer_id, forward_batch.out_cache_loc, k, v)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        o_new, lse_new = self.prefill_wrapper_ragged.run_return_lse(
            q, k.view(-1, self.num_kv_heads, self.head_dim), v.view(-1, self.num_kv_heads, self.head_dim)
        )
        o_old, lse_old = self.prefill_wrapper_paged.run_return_lse(q, self.kv_pool.get_kv(layer_id))
        out, _ = merge_state(o_new, lse_new, o_old, lse_old)
        return out
