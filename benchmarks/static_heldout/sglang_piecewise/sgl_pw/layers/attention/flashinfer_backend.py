"""FlashInfer attention backend: eager ragged/paged prefill (run between piecewise graphs), graph-mode decode."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.cascade import merge_state

from sgl_pw.layers.attention.base_attn_backend import AttentionBackend
from sgl_pw.layers.attention.utils import create_flashinfer_kv_indices_triton
from sgl_pw.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sgl_pw.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

GLOBAL_WORKSPACE_MB = int(os.environ.get("SGLANG_FLASHINFER_WORKSPACE_MB", 256))
global_workspace_buffer = None


@dataclass
class DecodeMetadata:
    decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper]


@dataclass
class PrefillMetadata:
    prefill_wrappers: List[BatchPrefillWithPagedKVCacheWrapper]
    use_ragged: bool
    extend_no_prefix: bool


class FlashInferAttnBackend(AttentionBackend):
    def __init__(self, model_runner: "ModelRunner"):
        super().__init__()
        self.device = model_runner.device
        self.num_qo_heads = model_runner.model_config.num_attention_heads // model_runner.tp_size
        self.num_kv_heads = model_runner.model_config.num_key_value_heads // model_runner.tp_size
        self.head_dim = model_runner.model_config.head_dim
        self.q_data_type = model_runner.dtype
        self.data_type = model_runner.kv_cache_dtype
        self.max_context_len = model_runner.model_config.context_len
        self.req_to_token = model_runner.req_to_token_pool.req_to_token

        global global_workspace_buffer
        if global_workspace_buffer is None:
            global_workspace_buffer = torch.empty(GLOBAL_WORKSPACE_MB * 1024 * 1024, dtype=torch.uint8, device=self.device)  # expect: FC106  # ok: FC105
        self.workspace_buffer = global_workspace_buffer

        max_bs = model_runner.req_to_token_pool.size
        self.kv_indptr = [torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)]
        self.qo_indptr = [torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)]
        self.kv_last_page_len = torch.ones((max_bs,), dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cpu = torch.ones((max_bs,), dtype=torch.int32)

        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.prefill_wrappers_paged = [BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", backend="fa2")]
        self.decode_wrappers = [BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", use_tensor_cores=True)]

        self.indices_updater_decode = FlashInferIndicesUpdaterDecode(model_runner, self)
        self.indices_updater_prefill = FlashInferIndicesUpdaterPrefill(model_runner, self)
        self.decode_cuda_graph_metadata: dict = {}
        self.forward_metadata: Optional[DecodeMetadata | PrefillMetadata] = None

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        if forward_batch.forward_mode.is_decode():
            self.indices_updater_decode.update(
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                forward_batch.seq_lens_cpu,
                forward_batch.seq_lens_sum,
                decode_wrappers=self.decode_wrappers,
            )
            self.forward_metadata = DecodeMetadata(self.decode_wrappers)
            return
        extend_no_prefix = not any(forward_batch.extend_prefix_lens_cpu)  # ok: FC101
        self.indices_updater_prefill.update(
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            forward_batch.extend_prefix_lens,
            prefill_wrappers=self.prefill_wrappers_paged,
            use_ragged=True,
            extend_seq_lens_cpu=forward_batch.extend_seq_lens_cpu,
        )
        self.forward_metadata = PrefillMetadata(self.prefill_wrappers_paged, True, extend_no_prefix)

    # ---- decode CUDA graphs -------------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf: Optional[torch.Tensor] = None):
        if kv_indices_buf is None:
            self.cuda_graph_kv_indices = torch.zeros(
                (max_num_tokens * self.max_context_len,), dtype=torch.int32, device=self.device
            )
        else:
            self.cuda_graph_kv_indices = kv_indices_buf

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info):
        decode_wrappers = [
            BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[0][: num_tokens + 1],
                paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:num_tokens],
            )
        ]
        seq_lens_sum = seq_lens.sum().item()  # expect: FC101
        self.indices_updater_decode.update(
            req_pool_indices, seq_lens, torch.ones(bs, dtype=torch.int32), seq_lens_sum, decode_wrappers=decode_wrappers
        )
        self.decode_cuda_graph_metadata[bs] = decode_wrappers
        self.forward_metadata = DecodeMetadata(decode_wrappers)

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu=None, raw_bs=None
    ):
        self.indices_updater_decode.update(
            req_pool_indices[:bs],
            seq_lens[:bs],
            seq_lens_cpu[:bs],
            seq_lens_sum,
            decode_wrappers=self.decode_cuda_graph_metadata[bs],
        )
        if raw_bs is not None and raw_bs < bs:
            # padded rows must not read any page
            self.kv_indptr[0][raw_bs + 1 : bs + 1] = self.kv_indptr[0][raw_bs]  # expect: FC104
        self.forward_metadata = DecodeMetadata(self.decode_cuda_graph_metadata[bs])

    # ---- forward -----------------------------------------------------------------------------------------------

    def forward_extend(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache=True):
        prefill_wrapper_paged = self.forward_metadata.prefill_wrappers[0]
        if getattr(prefill_wrapper_paged, "_cached_module", None) is None:  # expect: FC103
            raise RuntimeError("prefill wrapper used before plan()")
        if forward_batch.token_to_kv_pool._kv_layout != "NHD":  # ok: FC103
            raise NotImplementedError("FlashInfer backend expects an NHD KV pool")
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        o1, s1 = self.prefill_wrapper_ragged.forward_return_lse(
            q,
            k.view(-1, layer.tp_k_head_num, layer.head_dim),
            v.view(-1, layer.tp_v_head_num, layer.head_dim),
            causal=True,
            sm_scale=layer.scaling,
        )
        if self.forward_metadata.extend_no_prefix:
            o = o1
        else:
            o2, s2 = prefill_wrapper_paged.forward_return_lse(
                q, forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id), causal=False, sm_scale=layer.scaling
            )
            o, _ = merge_state(o1, s1, o2, s2)
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache=True):
        assert self.forward_metadata is not None  # ok: FC109
        decode_wrapper = self.forward_metadata.decode_wrappers[0]
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        o = decode_wrapper.forward(  # ok: FC108
            q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim),
            forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id),
            sm_scale=layer.scaling,
            logits_soft_cap=layer.logit_cap,
        )
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)


class FlashInferIndicesUpdaterDecode:
    def __init__(self, model_runner: "ModelRunner", attn_backend: FlashInferAttnBackend):
        self.num_qo_heads = attn_backend.num_qo_heads
        self.num_kv_heads = attn_backend.num_kv_heads
        self.head_dim = attn_backend.head_dim
        self.data_type = attn_backend.data_type
        self.q_data_type = attn_backend.q_data_type
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.update = self.update_single_wrapper

    def update_single_wrapper(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, decode_wrappers):
        self.call_begin_forward(decode_wrappers[0], req_pool_indices, seq_lens, seq_lens_sum, self.kv_indptr[0], seq_lens_cpu)

    def call_begin_forward(self, wrapper, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum, kv_indptr, seq_lens_cpu):
        bs = len(req_pool_indices)
        kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)  # ok: FC104
        kv_indptr = kv_indptr[: bs + 1]
        if wrapper.is_cuda_graph_enabled:
            kv_indices = wrapper._paged_kv_indices_buf  # expect: FC103
        else:
            kv_indices = torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=req_pool_indices.device)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, None, kv_indices, self.req_to_token.shape[1]
        )
        indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        indptr_cpu[1:] = torch.cumsum(seq_lens_cpu[:bs], dim=0)
        wrapper.begin_forward(  # ok: FC102
            indptr_cpu,
            kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            data_type=self.data_type,
            q_data_type=self.q_data_type,
        )


class FlashInferIndicesUpdaterPrefill:
    def __init__(self, model_runner: "ModelRunner", attn_backend: FlashInferAttnBackend):
        self.num_qo_heads = attn_backend.num_qo_heads
        self.num_kv_heads = attn_backend.num_kv_heads
        self.head_dim = attn_backend.head_dim
        self.q_data_type = attn_backend.q_data_type
        self.kv_indptr = attn_backend.kv_indptr
        self.qo_indptr = attn_backend.qo_indptr
        self.kv_last_page_len = attn_backend.kv_last_page_len
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.prefill_wrapper_ragged = attn_backend.prefill_wrapper_ragged

    def update(self, req_pool_indices, seq_lens, prefix_lens, prefill_wrappers, use_ragged, extend_seq_lens_cpu):
        if use_ragged:
            paged_kernel_lens = prefix_lens
            paged_kernel_lens_sum = paged_kernel_lens.sum().item()  # expect: FC101
        else:
            paged_kernel_lens = seq_lens
            paged_kernel_lens_sum = None
        self.call_begin_forward(
            self.prefill_wrapper_ragged,
            prefill_wrappers[0],
            req_pool_indices,
            paged_kernel_lens,
            paged_kernel_lens_sum,
            self.kv_indptr[0],
            self.qo_indptr[0],
            use_ragged,
            extend_seq_lens_cpu,
        )

    def call_begin_forward(
        self, wrapper_ragged, wrapper_paged, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum, kv_indptr, qo_indptr, use_ragged, extend_seq_lens_cpu
    ):
        bs = len(req_pool_indices)
        kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)  # ok: FC104
        kv_indptr = kv_indptr[: bs + 1]
        kv_indices = torch.empty(paged_kernel_lens_sum + 256, dtype=torch.int32, device=req_pool_indices.device)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, None, kv_indices, self.req_to_token.shape[1]
        )
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        qo_indptr_cpu[1:] = torch.from_numpy(np.cumsum(np.asarray(extend_seq_lens_cpu, dtype=np.int32)))
        qo_indptr[: bs + 1].copy_(qo_indptr_cpu, non_blocking=True)
        if use_ragged:
            wrapper_ragged.begin_forward(  # ok: FC102
                qo_indptr_cpu, qo_indptr_cpu, self.num_qo_heads, self.num_kv_heads, self.head_dim, q_data_type=self.q_data_type
            )
        wrapper_paged.begin_forward(  # expect: FC102
            qo_indptr_cpu,
            kv_indptr,
            kv_indices,
            self.kv_last_page_len[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            q_data_type=self.q_data_type,
        )
