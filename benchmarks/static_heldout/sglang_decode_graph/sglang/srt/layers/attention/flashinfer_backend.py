from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from sglang.global_config import global_config
from sglang.srt.layers.attention.utils import create_flashinfer_kv_indices, fast_decode_plan
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner


@dataclass
class DecodeMetadata:
    decode_wrappers: list


@dataclass
class PrefillMetadata:
    prefill_wrappers: list
    use_ragged: bool


class FlashInferIndicesUpdaterDecode:
    def __init__(self, model_runner: ModelRunner, attn_backend: FlashInferAttnBackend):
        self.num_qo_heads = model_runner.model_config.num_attention_heads
        self.num_kv_heads = model_runner.model_config.num_key_value_heads
        self.head_dim = model_runner.model_config.head_dim
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_last_page_len = attn_backend.kv_last_page_len
        self.kv_indptr_cpu = attn_backend.kv_indptr_cpu
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.device = model_runner.device

    def update(self, req_pool_indices, seq_lens, seq_lens_sum, decode_wrappers, seq_lens_cpu=None):
        for w in decode_wrappers:
            self.call_begin_forward(w, req_pool_indices, seq_lens, seq_lens_sum, self.kv_indptr, seq_lens_cpu)

    def call_begin_forward(self, w, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum, kv_indptr, seq_lens_cpu):
        bs = len(req_pool_indices)
        kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)  # ok: FC104
        kv_indptr = kv_indptr[: bs + 1]
        if w.is_cuda_graph_enabled:
            kv_indices = w._paged_kv_indices_buf  # expect: FC103
        else:
            kv_indices = torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=self.device)
        create_flashinfer_kv_indices(self.req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_indices)
        if seq_lens_cpu is not None:
            indptr_host = self.kv_indptr_cpu[: bs + 1]
            torch.cumsum(seq_lens_cpu, dim=0, out=indptr_host[1:])
            w.begin_forward(indptr_host, kv_indices, self.kv_last_page_len_cpu[:bs], self.num_qo_heads, self.num_kv_heads, self.head_dim, 1)  # ok: FC102
        else:
            w.begin_forward(kv_indptr, kv_indices, self.kv_last_page_len[:bs], self.num_qo_heads, self.num_kv_heads, self.head_dim, 1)  # expect: FC102


class FlashInferAttnBackend:
    def __init__(self, model_runner: ModelRunner):
        self.device = model_runner.device
        self.max_context_len = model_runner.model_config.context_len
        self.num_qo_heads = model_runner.model_config.num_attention_heads
        self.num_kv_heads, self.head_dim = model_runner.model_config.num_key_value_heads, model_runner.model_config.head_dim
        max_bs = model_runner.req_to_token_pool.size
        self.workspace_buffer = torch.empty(global_config.flashinfer_workspace_size, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones((max_bs,), dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros((max_bs + 1,), dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones((max_bs,), dtype=torch.int32, pin_memory=True)
        self.qo_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.workspace_buffer, "NHD")  # ok: FC105
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.decode_wrappers = [BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")]
        self.indices_updater_decode = FlashInferIndicesUpdaterDecode(model_runner, self)
        self.decode_cuda_graph_metadata = {}
        self.forward_metadata = None
        self.cuda_graph_kv_indices = None

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        if forward_batch.forward_mode.is_decode_or_idle():
            self.indices_updater_decode.update(forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.seq_lens_sum,
                                               self.decode_wrappers, seq_lens_cpu=forward_batch.seq_lens_cpu)
            self.forward_metadata = DecodeMetadata(self.decode_wrappers)
            return
        bs = forward_batch.batch_size
        extend_no_prefix = not any(forward_batch.extend_prefix_lens)  # expect: FC101
        if any(forward_batch.extend_prefix_lens_cpu):  # ok: FC101
            extend_no_prefix = False
        self.qo_indptr[1 : bs + 1] = torch.cumsum(forward_batch.extend_seq_lens, dim=0)
        qo_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        qo_indptr_host[1:] = torch.cumsum(torch.tensor(forward_batch.extend_seq_lens_cpu), dim=0)
        ragged = self.prefill_wrapper_ragged
        ragged.begin_forward(qo_indptr_host, qo_indptr_host, self.num_qo_heads, self.num_kv_heads, self.head_dim)  # ok: FC102
        paged = self.prefill_wrapper_paged
        paged.plan(self.qo_indptr[: bs + 1], self.kv_indptr[: bs + 1], self.cuda_graph_kv_indices, self.kv_last_page_len[:bs], self.num_qo_heads, self.num_kv_heads, self.head_dim, 1)  # expect: FC102
        self.forward_metadata = PrefillMetadata([paged], extend_no_prefix)

    def init_cuda_graph_state(self, max_bs: int):
        self.cuda_graph_kv_indices = torch.zeros((max_bs * self.max_context_len,), dtype=torch.int32, device=self.device)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, forward_mode):
        decode = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: num_tokens + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:num_tokens],
        )
        self.indices_updater_decode.update(req_pool_indices, seq_lens, bs * self.max_context_len, [decode])
        decode.begin_forward = partial(fast_decode_plan, decode)
        self.decode_cuda_graph_metadata[bs] = decode
        self.forward_metadata = DecodeMetadata([decode])

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, forward_mode, seq_lens_cpu):
        decode = self.decode_cuda_graph_metadata[bs]
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.indices_updater_decode.update(req_pool_indices[:bs], seq_lens[:bs], seq_lens_sum, [decode], seq_lens_cpu=seq_lens_cpu[:bs])
        self.cuda_graph_kv_indices[seq_lens_sum:].zero_()  # expect: FC104
        self.forward_metadata = DecodeMetadata([decode])

    def forward_decode(self, q, k_cache, v_cache, window_lens: Optional[torch.Tensor] = None):
        decode = self.forward_metadata.decode_wrappers[0]
        if window_lens is not None:
            bs = window_lens.shape[0]
            torch.cumsum(window_lens, 0, out=self.kv_indptr[1 : bs + 1])  # expect: FC104
        return decode.run(q, (k_cache, v_cache))  # ok: FC108
