"""FlashInfer backend for decode and NGRAM tree verify, eager or captured."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ...model_executor.forward_batch_info import ForwardBatch, ForwardMode

_WS_BYTES = {
    "decode": lambda: 128 << 20,
    "verify": lambda: 256 << 20,
}


class WorkspaceSpec(NamedTuple):
    nbytes: int

    @staticmethod
    def from_server_args(args, cfg) -> "WorkspaceSpec":
        # split-k partials of the largest decode batch: bs x heads x splits x (head_dim + lse) in fp32
        return WorkspaceSpec(args.max_running_requests * cfg.num_attention_heads * 16 * (cfg.head_dim + 1) * 4)


@triton.jit
def create_flashinfer_kv_indices_triton(req_to_token_ptr, req_pool_indices_ptr, lens_ptr, kv_indptr_ptr, kv_indices_ptr, stride: tl.constexpr):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    n = tl.load(lens_ptr + pid)
    for off in range(0, n, 512):
        cols = off + tl.arange(0, 512)
        tl.store(kv_indices_ptr + start + cols, tl.load(req_to_token_ptr + req * stride + cols, mask=cols < n), mask=cols < n)


@dataclass
class ForwardMetadata:
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    verify_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None


class FlashInferAttnBackend:
    def __init__(self, model_runner) -> None:
        args, cfg = model_runner.server_args, model_runner.model_config
        self.device, self.req_to_token = model_runner.device, model_runner.req_to_token
        self.num_qo_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        n = args.max_running_requests
        self.workspace_buffer = torch.empty(WorkspaceSpec.from_server_args(args, cfg).nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        ws_kind = "verify" if args.speculative_algorithm == "NGRAM" else "decode"
        self.verify_workspace = torch.zeros(_WS_BYTES[ws_kind](), dtype=torch.uint8, device=self.device)  # expect: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", use_tensor_cores=True)
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.verify_workspace, "NHD")
        self._tree_attn = self._make_tree_attn(self.verify_wrapper)
        self.kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(args.max_total_tokens, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cpu = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.decode_graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.verify_graph_wrappers: dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self._use_cuda_graph = False
        self.forward_metadata = ForwardMetadata()

    def _update_indices(self, bs, req_pool_indices, kv_lens, kv_lens_cpu, indptr, indptr_cpu, indices) -> None:
        indptr_cpu[0] = 0
        torch.cumsum(kv_lens_cpu[:bs], 0, dtype=torch.int32, out=indptr_cpu[1 : bs + 1])
        indptr[: bs + 1].copy_(indptr_cpu[: bs + 1], non_blocking=True)
        create_flashinfer_kv_indices_triton[(bs,)](self.req_to_token, req_pool_indices, kv_lens, indptr, indices, self.req_to_token.shape[1])  # ok: FC104

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if fb.forward_mode.is_target_verify():
            n = fb.spec_info.draft_token_num
            if fb.seq_lens[:bs].sum().item() + bs * n > self.kv_indices.numel():  # expect: FC101
                raise RuntimeError("kv_indices cannot hold this verify batch")
            self._update_indices(bs, fb.req_pool_indices, fb.seq_lens + n, fb.seq_lens_cpu + n, self.kv_indptr, self.kv_indptr_cpu, self.kv_indices)
            qo_indptr = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=self.device)
            self.verify_wrapper.plan(  # expect: FC102
                qo_indptr, self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], self.num_qo_heads,
                self.num_kv_heads, self.head_dim, 1, custom_mask=fb.spec_info.custom_mask, q_data_type=torch.bfloat16,
            )
            self.forward_metadata = ForwardMetadata(verify_wrapper=self.verify_wrapper)
            return
        self._update_indices(bs, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, self.kv_indptr, self.kv_indptr_cpu, self.kv_indices)
        self.decode_wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], self.num_qo_heads, self.num_kv_heads, self.head_dim, 1
        )
        self.forward_metadata = ForwardMetadata(decode_wrapper=self.decode_wrapper)

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int, num_draft: int) -> None:
        self.cuda_graph_qo_indptr = torch.arange(0, (max_bs + 1) * num_draft, num_draft, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        # packed tree masks: one bit per (draft token, kv position); sized for short contexts and grown on demand
        self.cuda_graph_custom_mask = torch.zeros(max_bs * num_draft * 4096 // 8, dtype=torch.uint8, device=self.device)
        self._use_cuda_graph = True

    def init_forward_metadata_capture_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, mode: ForwardMode, spec_info) -> None:
        if mode.is_target_verify():
            self.cuda_graph_mask_indptr[: bs + 1].zero_()  # ok: FC104
            self.verify_graph_wrappers[bs] = BatchPrefillWithPagedKVCacheWrapper(
                self.verify_workspace, "NHD", use_cuda_graph=True,
                qo_indptr_buf=self.cuda_graph_qo_indptr[: bs + 1], paged_kv_indptr_buf=self.cuda_graph_kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.cuda_graph_kv_indices, paged_kv_last_page_len_buf=self.cuda_graph_last_page_len[:bs],
                custom_mask_buf=self.cuda_graph_custom_mask, mask_indptr_buf=self.cuda_graph_mask_indptr[: bs + 1],
            )
        else:
            self.decode_graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1], paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
            )
        self.init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, seq_lens_cpu, mode, spec_info)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_cpu, mode: ForwardMode, spec_info) -> None:
        if not self._use_cuda_graph:  # ok: FC103
            raise RuntimeError("init_cuda_graph_state() must run before graph capture")
        indptr, indptr_cpu, indices = self.cuda_graph_kv_indptr, self.cuda_graph_kv_indptr_cpu, self.cuda_graph_kv_indices
        if not mode.is_target_verify():
            self._update_indices(bs, req_pool_indices, seq_lens, seq_lens_cpu, indptr, indptr_cpu, indices)
            wrapper = self.decode_graph_wrappers[bs]
            wrapper.plan(indptr_cpu[: bs + 1], indices, self.kv_last_page_len_cpu[:bs], self.num_qo_heads, self.num_kv_heads, self.head_dim, 1)
            self.forward_metadata = ForwardMetadata(decode_wrapper=wrapper)
            return
        n = spec_info.draft_token_num
        kv_lens_cpu = seq_lens_cpu[:bs] + n
        mask_bytes = (int((kv_lens_cpu * n).sum()) + 7) // 8
        if mask_bytes > self.cuda_graph_custom_mask.numel():
            self.cuda_graph_custom_mask = torch.zeros(2 * mask_bytes, dtype=torch.uint8, device=self.device)  # expect: FC107
        self._update_indices(bs, req_pool_indices, seq_lens[:bs] + n, kv_lens_cpu, indptr, indptr_cpu, indices)
        qo_indptr_cpu = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        self.verify_graph_wrappers[bs].plan(  # ok: FC102
            qo_indptr_cpu, indptr_cpu[: bs + 1], indices, self.kv_last_page_len_cpu[:bs], self.num_qo_heads, self.num_kv_heads,
            self.head_dim, 1, custom_mask=spec_info.custom_mask, q_data_type=torch.bfloat16,
        )
        self.forward_metadata = ForwardMetadata(verify_wrapper=self.verify_graph_wrappers[bs])

    def _make_tree_attn(self, wrapper: BatchPrefillWithPagedKVCacheWrapper):
        def tree_attn(q: torch.Tensor, kv_buffer) -> torch.Tensor:
            return wrapper.run(q, kv_buffer)  # expect: FC108

        return tree_attn

    def forward(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        pool = fb.token_to_kv_pool
        pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        kv = pool.get_kv_buffer(layer.layer_id)
        if fb.forward_mode.is_target_verify():
            return self._tree_attn(q, kv)
        return self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108
