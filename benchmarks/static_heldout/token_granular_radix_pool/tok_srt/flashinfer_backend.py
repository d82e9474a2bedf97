"""FlashInfer attention over a token-granular pool (page size 1).

Every token is its own page, so ``kv_last_page_len`` is all ones and ``kv_indices`` is the
request's token slots, gathered from ``req_to_token`` by a Triton kernel straight into the
wrapper's index buffer."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, List, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)

from tok_srt.forward_batch import ForwardBatch, ForwardMode
from tokpool.global_config import global_config
from tokpool.kv_indices import create_flashinfer_kv_indices_triton

if TYPE_CHECKING:
    from tok_srt.model_runner import ModelRunner

global_workspace_buffer: Optional[torch.Tensor] = None


@dataclasses.dataclass
class DecodeMetadata:
    decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper]


@dataclasses.dataclass
class PrefillMetadata:
    prefill_wrappers: List[BatchPrefillWithPagedKVCacheWrapper]
    use_ragged: bool
    extend_no_prefix: bool


class FlashInferAttnBackend:
    def __init__(self, model_runner: "ModelRunner"):
        global global_workspace_buffer
        args = model_runner.server_args
        self.device = model_runner.device
        self.num_qo_heads = args.num_attention_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.max_context_len = args.context_len
        self.kv_layout = model_runner.token_to_kv_pool._kv_layout  # ok: FC103
        if global_workspace_buffer is None:
            global_workspace_buffer = torch.empty(global_config.flashinfer_workspace_size, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.workspace_buffer = global_workspace_buffer
        # the ragged pass of a chunk attends the chunk's own tokens: scratch grows with the chunk
        per_token = self.num_qo_heads * (self.head_dim * 4 + 4)
        self.ragged_workspace = torch.empty(args.chunked_prefill_size * per_token * 2, dtype=torch.uint8, device=self.device)  # ok: FC106

        max_bs = model_runner.req_to_token_pool.size
        self.kv_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones((max_bs,), dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cpu = torch.ones((max_bs,), dtype=torch.int32, pin_memory=True)

        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self.kv_layout)
        self.prefill_wrappers_paged = [BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, self.kv_layout)]
        self.decode_wrappers = [
            BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, self.kv_layout, use_tensor_cores=True)
        ]
        self.indices_updater_decode = FlashInferIndicesUpdaterDecode(model_runner, self)
        self.indices_updater_prefill = FlashInferIndicesUpdaterPrefill(model_runner, self)
        self.decode_cuda_graph_metadata: Dict[int, List[BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.prefill_cuda_graph_metadata: Dict[int, List[BatchPrefillWithPagedKVCacheWrapper]] = {}
        self.cuda_graph_kv_indices: Optional[torch.Tensor] = None
        self.forward_metadata = None

    # ------------------------------------------------------------------ per step
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_decode():
            # the batch's seq_lens_sum is stale after a retraction; recount from the host mirror
            seq_lens_sum = forward_batch.seq_lens_cpu.sum().item()  # ok: FC101
            self.indices_updater_decode.update(
                forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.seq_lens_cpu, seq_lens_sum,
                decode_wrappers=self.decode_wrappers,
            )
            self.forward_metadata = DecodeMetadata(self.decode_wrappers)
            return
        prefix_lens_cpu = forward_batch.extend_prefix_lens_cpu
        extend_no_prefix = not bool(prefix_lens_cpu.any())
        use_ragged = True
        self.indices_updater_prefill.update(
            forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.seq_lens_cpu,
            forward_batch.seq_lens_sum, forward_batch.extend_prefix_lens, prefix_lens_cpu,
            prefill_wrappers=self.prefill_wrappers_paged, use_ragged=use_ragged, custom_mask=None,
        )
        self.forward_metadata = PrefillMetadata(self.prefill_wrappers_paged, use_ragged, extend_no_prefix)

    # ------------------------------------------------------------------ CUDA graphs
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros((max_bs * self.max_context_len,), dtype=torch.int32, device=self.device)
        self.cuda_graph_qo_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.cuda_graph_custom_mask = torch.zeros((max_num_tokens * self.max_context_len,), dtype=torch.uint8, device=self.device)
        self.cuda_graph_qk_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_last_page_len[:max_bs].fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, num_tokens: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor, forward_mode: ForwardMode,
    ) -> None:
        if forward_mode.is_decode():
            decode_wrappers = [
                BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace_buffer,
                    self.kv_layout,
                    use_cuda_graph=True,
                    use_tensor_cores=True,
                    paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                    paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                    paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                )
            ]
            self.indices_updater_decode.update(
                req_pool_indices, seq_lens, seq_lens_cpu, bs, decode_wrappers=decode_wrappers
            )
            self.decode_cuda_graph_metadata[bs] = decode_wrappers
            self.forward_metadata = DecodeMetadata(decode_wrappers)
            return
        # target verify: every request checks num_tokens // bs draft tokens at once
        prefill_wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(
                self.workspace_buffer,
                self.kv_layout,
                use_cuda_graph=True,
                qo_indptr_buf=self.cuda_graph_qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
                custom_mask_buf=self.cuda_graph_custom_mask,
                mask_indptr_buf=self.cuda_graph_qk_indptr[: bs + 1],
            )
        ]
        draft = num_tokens // bs
        prefix_lens = seq_lens - draft
        self.indices_updater_prefill.update(
            req_pool_indices, seq_lens, seq_lens_cpu, bs * draft, prefix_lens, seq_lens_cpu - draft,
            prefill_wrappers=prefill_wrappers, use_ragged=False, custom_mask=self.cuda_graph_custom_mask,
        )
        self.prefill_cuda_graph_metadata[bs] = prefill_wrappers
        # the draft tokens attend each other through the ragged pass, the prefix through the pages
        self.forward_metadata = PrefillMetadata(prefill_wrappers, use_ragged=True, extend_no_prefix=False)

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor, forward_mode: ForwardMode, num_tokens: int,
    ) -> None:
        if forward_mode.is_decode():
            seq_lens_sum = seq_lens[:bs].sum().item()  # expect: FC101
            self.indices_updater_decode.update(
                req_pool_indices[:bs], seq_lens[:bs], seq_lens_cpu[:bs], seq_lens_sum,
                decode_wrappers=self.decode_cuda_graph_metadata[bs],
            )
            # padded rows attend nothing
            self.kv_indptr[raw_bs + 1 : bs + 1] = self.kv_indptr[raw_bs]  # expect: FC104
            self.forward_metadata = DecodeMetadata(self.decode_cuda_graph_metadata[bs])
            return
        draft = num_tokens // bs
        self.indices_updater_prefill.update(
            req_pool_indices[:bs], seq_lens[:bs], seq_lens_cpu[:bs], bs * draft, seq_lens[:bs] - draft,
            seq_lens_cpu[:bs] - draft, prefill_wrappers=self.prefill_cuda_graph_metadata[bs],
            use_ragged=False, custom_mask=self.cuda_graph_custom_mask,
        )
        self.forward_metadata = PrefillMetadata(self.prefill_cuda_graph_metadata[bs], use_ragged=True, extend_no_prefix=False)

    # ------------------------------------------------------------------ attention
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        fb.token_to_kv_pool.set_kv_buffer(layer_id, fb.out_cache_loc, k, v)
        if fb.forward_mode.is_decode():
            return self.forward_decode(q, layer_id, fb)
        return self.forward_extend(q, k, v, layer_id, fb)

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        decode_wrapper = self.forward_metadata.decode_wrappers[0]
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer_id)
        return decode_wrapper.run(q, (k_buf.unsqueeze(1), v_buf.unsqueeze(1)))  # ok: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        md = self.forward_metadata
        paged = md.prefill_wrappers[0]
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer_id)
        paged_kv = (k_buf.unsqueeze(1), v_buf.unsqueeze(1))
        if not md.use_ragged:
            return paged.run(q, paged_kv)
        o1, s1 = self.prefill_wrapper_ragged.run_return_lse(q, k, v)  # expect: FC108
        if md.extend_no_prefix:
            return o1
        o2, s2 = paged.run_return_lse(q, paged_kv)
        o, _ = merge_state(o1, s1, o2, s2)
        return o


class FlashInferIndicesUpdaterDecode:
    def __init__(self, model_runner: "ModelRunner", attn_backend: FlashInferAttnBackend):
        self.num_qo_heads = attn_backend.num_qo_heads
        self.num_kv_heads = attn_backend.num_kv_heads
        self.head_dim = attn_backend.head_dim
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_last_page_len = attn_backend.kv_last_page_len
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.update = self.update_single_wrapper

    def update_single_wrapper(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor,
        seq_lens_sum: int, decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper],
    ) -> None:
        self.call_begin_forward(
            decode_wrappers[0], req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, self.kv_indptr
        )

    def call_begin_forward(
        self, wrapper: BatchDecodeWithPagedKVCacheWrapper, req_pool_indices: torch.Tensor,
        paged_kernel_lens: torch.Tensor, paged_kernel_lens_cpu: torch.Tensor, paged_kernel_lens_sum: int,
        kv_indptr: torch.Tensor,
    ) -> None:
        bs = len(req_pool_indices)
        kv_indptr = kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(paged_kernel_lens, dim=0)  # ok: FC104
        if wrapper.is_cuda_graph_enabled:
            kv_indices = wrapper._paged_kv_indices_buf  # expect: FC103
        else:
            kv_indices = torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=req_pool_indices.device)
        create_flashinfer_kv_indices_triton[(bs,)](self.req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_indices, self.req_to_token.shape[1])  # ok: FC104
        if wrapper.is_cuda_graph_enabled:
            kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
            torch.cumsum(paged_kernel_lens_cpu, dim=0, out=kv_indptr_cpu[1:])
            wrapper.plan(  # ok: FC102
                kv_indptr_cpu,
                kv_indices,
                self.kv_last_page_len_cpu[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                1,
                q_data_type=torch.bfloat16,
            )
        else:
            wrapper.begin_forward(  # expect: FC102
                kv_indptr,
                kv_indices,
                self.kv_last_page_len[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                1,
                q_data_type=torch.bfloat16,
            )


class FlashInferIndicesUpdaterPrefill:
    def __init__(self, model_runner: "ModelRunner", attn_backend: FlashInferAttnBackend):
        self.device = attn_backend.device
        self.num_qo_heads = attn_backend.num_qo_heads
        self.num_kv_heads = attn_backend.num_kv_heads
        self.head_dim = attn_backend.head_dim
        self.kv_indptr = attn_backend.kv_indptr
        self.qo_indptr = attn_backend.qo_indptr
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.prefill_wrapper_ragged = attn_backend.prefill_wrapper_ragged
        self.max_mask_len = model_runner.server_args.max_mask_len
        self.custom_mask_buf: Optional[torch.Tensor] = None
        self.update = self.update_single_wrapper

    def update_single_wrapper(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor,
        seq_lens_sum: int, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor,
        prefill_wrappers: List[BatchPrefillWithPagedKVCacheWrapper], use_ragged: bool,
        custom_mask: Optional[torch.Tensor],
    ) -> None:
        if use_ragged:
            paged_lens, paged_lens_cpu = prefix_lens, prefix_lens_cpu
            paged_sum = int(prefix_lens_cpu.sum())
        else:
            paged_lens, paged_lens_cpu, paged_sum = seq_lens, seq_lens_cpu, seq_lens_sum
        if custom_mask is not None:
            if self.custom_mask_buf is None:
                self.custom_mask_buf = torch.empty(self.max_mask_len, dtype=torch.uint8, device=self.device)  # ok: FC107
            n = custom_mask.numel()
            self.custom_mask_buf[:n].copy_(custom_mask.view(-1)[:n])
            custom_mask = self.custom_mask_buf[:n]
        self.call_begin_forward(
            self.prefill_wrapper_ragged, prefill_wrappers[0], req_pool_indices, paged_lens, paged_lens_cpu,
            paged_sum, seq_lens, seq_lens_cpu, prefix_lens, prefix_lens_cpu, self.kv_indptr, self.qo_indptr,
            use_ragged, custom_mask,
        )

    def call_begin_forward(
        self, wrapper_ragged: BatchPrefillWithRaggedKVCacheWrapper, wrapper_paged: BatchPrefillWithPagedKVCacheWrapper,
        req_pool_indices: torch.Tensor, paged_lens: torch.Tensor, paged_lens_cpu: torch.Tensor, paged_sum: int,
        seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor,
        kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, use_ragged: bool, custom_mask: Optional[torch.Tensor],
    ) -> None:
        bs = len(seq_lens)
        kv_indptr = kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(paged_lens, dim=0)
        kv_indices = torch.empty(paged_sum + 256, dtype=torch.int32, device=req_pool_indices.device)
        create_flashinfer_kv_indices_triton[(bs,)](self.req_to_token, req_pool_indices, paged_lens, kv_indptr, kv_indices, self.req_to_token.shape[1])
        qo_indptr = qo_indptr[: bs + 1]
        qo_indptr[1:] = torch.cumsum(seq_lens - prefix_lens, dim=0)
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(seq_lens_cpu - prefix_lens_cpu, dim=0, out=qo_indptr_cpu[1:])
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(paged_lens_cpu, dim=0, out=kv_indptr_cpu[1:])
        if use_ragged:
            wrapper_ragged.begin_forward(  # expect: FC102
                qo_indptr,
                qo_indptr,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        wrapper_paged.plan(  # ok: FC102
            qo_indptr_cpu,
            kv_indptr_cpu,
            kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            causal=not use_ragged,
            custom_mask=custom_mask,
            q_data_type=torch.bfloat16,
        )
