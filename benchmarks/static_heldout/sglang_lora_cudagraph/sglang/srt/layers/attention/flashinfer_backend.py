"""FlashInfer attention backend: decode, extend and target-verify, eager and CUDA-graph."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Union

import torch
import triton
import triton.language as tl
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)
from flashinfer.decode import fast_decode_plan

from sglang.srt.layers.attention import AttentionBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner


@triton.jit
def gather_kv_slots_kernel(
    req_to_token_ptr,
    req_pool_indices_ptr,
    kv_lens_ptr,
    kv_indptr_ptr,
    out_ptr,
    row_stride: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per request: copy its first kv_len token slots to out[kv_indptr[pid]:]."""
    pid = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + pid).to(tl.int64)
    start = tl.load(kv_indptr_ptr + pid)
    kv_len = tl.load(kv_lens_ptr + pid)
    for base in range(0, tl.cdiv(kv_len, BLOCK)):
        offs = base * BLOCK + tl.arange(0, BLOCK)
        mask = offs < kv_len
        slots = tl.load(req_to_token_ptr + row * row_stride + offs, mask=mask)
        tl.store(out_ptr + start + offs, slots, mask=mask)


@dataclass
class DecodeMetadata:
    decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper]


@dataclass
class PrefillMetadata:
    prefill_wrappers: List[BatchPrefillWithPagedKVCacheWrapper]
    use_ragged: bool
    extend_no_prefix: bool


class FlashInferAttnBackend(AttentionBackend):
    # float workspace shared by every eager and graph wrapper
    workspace_size = 384 * 1024 * 1024

    def __init__(self, model_runner: "ModelRunner"):
        super().__init__()
        cfg = model_runner.model_config
        self.device = model_runner.device
        self.num_qo_heads = cfg.num_attention_heads // model_runner.tp_size
        self.num_kv_heads = max(cfg.num_key_value_heads // model_runner.tp_size, 1)
        self.head_dim = cfg.head_dim
        self.data_type = model_runner.kv_cache_dtype
        self.q_data_type = model_runner.dtype
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.sliding_window_size = cfg.sliding_window
        self.use_tensor_cores = self.num_qo_heads // self.num_kv_heads > 4
        max_bs = model_runner.req_to_token_pool.size

        self.workspace_buffer = torch.empty(self.workspace_size, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)

        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer, "NHD", use_tensor_cores=self.use_tensor_cores
        )
        # Sliding-window layers: trtllm-gen on Blackwell, FA2 elsewhere; their own workspace, sized for
        # the window of every request.
        window_backend = "trtllm-gen" if model_runner.is_blackwell else "fa2"
        window_tokens = min(self.sliding_window_size or cfg.context_len, cfg.context_len)
        self.window_workspace = torch.empty(  # expect: FC105
            max_bs * self.num_qo_heads * (window_tokens // 64 + 1) * 1024, dtype=torch.uint8, device=self.device
        )
        self.window_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.window_workspace, "NHD", use_tensor_cores=self.use_tensor_cores, backend=window_backend
        )
        self._softcap_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self.logit_cap = float(cfg.attn_logit_softcapping or 0.0)

        self.indices_updater_decode = FlashInferIndicesUpdaterDecode(model_runner, self)
        self.indices_updater_prefill = FlashInferIndicesUpdaterPrefill(model_runner, self)
        self.forward_metadata: Optional[Union[DecodeMetadata, PrefillMetadata]] = None
        self.decode_cuda_graph_metadata: Dict[int, List[BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.prefill_cuda_graph_metadata: Dict[int, List[BatchPrefillWithPagedKVCacheWrapper]] = {}

    def _softcap_decode_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        # soft-capped layers need a plan of their own (the cap is a plan argument)
        if self._softcap_wrapper is None:
            self._softcap_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self.workspace_buffer, "NHD", use_tensor_cores=self.use_tensor_cores
            )
        return self._softcap_wrapper

    def _eager_decode_wrappers(self) -> List[BatchDecodeWithPagedKVCacheWrapper]:
        wrappers = [self.decode_wrapper]
        if self.sliding_window_size:
            wrappers.append(self.window_decode_wrapper)
        if self.logit_cap > 0:
            wrappers.append(self._softcap_decode_wrapper())
        return wrappers

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_decode_or_idle():
            self.indices_updater_decode.update(
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                forward_batch.seq_lens_cpu,
                forward_batch.seq_lens_sum,
                decode_wrappers=self._eager_decode_wrappers(),
            )
            self.forward_metadata = DecodeMetadata([self.decode_wrapper])
            return
        extend_no_prefix = not any(forward_batch.extend_prefix_lens_cpu)  # ok: FC101
        # the ragged + paged merge only pays off when every new segment is long
        use_ragged = extend_no_prefix or bool((forward_batch.extend_seq_lens > 256).all())  # expect: FC101
        self.indices_updater_prefill.update(
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            forward_batch.seq_lens_cpu,
            forward_batch.seq_lens_sum,
            prefix_lens=forward_batch.extend_prefix_lens,
            prefix_lens_cpu=forward_batch.extend_prefix_lens_cpu,
            prefill_wrappers=[self.prefill_wrapper_paged],
            use_ragged=use_ragged,
        )
        self.forward_metadata = PrefillMetadata([self.prefill_wrapper_paged], use_ragged, extend_no_prefix)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros(
            max_num_tokens * self.req_to_token.shape[1], dtype=torch.int32, device=self.device
        )
        self.cuda_graph_qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        forward_mode: ForwardMode,
        spec_num_draft_tokens: int,
    ) -> None:
        if forward_mode.is_decode_or_idle():
            decode_wrappers = [
                BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace_buffer,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=self.use_tensor_cores,
                    paged_kv_indptr_buffer=self.kv_indptr[: num_tokens + 1],
                    paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                    paged_kv_last_page_len_buffer=self.kv_last_page_len[:num_tokens],
                )
            ]
            self.indices_updater_decode.update(
                req_pool_indices, seq_lens, seq_lens_cpu, int(seq_lens_cpu.sum()), decode_wrappers=decode_wrappers
            )
            self.decode_cuda_graph_metadata[bs] = decode_wrappers
            self.forward_metadata = DecodeMetadata(decode_wrappers)
            return
        self.cuda_graph_qo_indptr[: bs + 1].copy_(torch.arange(bs + 1, device=self.device) * spec_num_draft_tokens)  # ok: FC104
        prefill_wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(
                self.workspace_buffer,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=self.cuda_graph_qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
            )
        ]
        self.indices_updater_prefill.update(
            req_pool_indices,
            seq_lens,
            seq_lens_cpu,
            int(seq_lens_cpu.sum()),
            prefix_lens=None,
            prefix_lens_cpu=None,
            prefill_wrappers=prefill_wrappers,
            use_ragged=False,
            spec_num_draft_tokens=spec_num_draft_tokens,
        )
        self.prefill_cuda_graph_metadata[bs] = prefill_wrappers
        self.forward_metadata = PrefillMetadata(prefill_wrappers, False, False)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        forward_mode: ForwardMode,
        spec_info,
        seq_lens_cpu: torch.Tensor,
        spec_num_draft_tokens: int,
    ) -> None:
        if forward_mode.is_decode_or_idle():
            self.indices_updater_decode.update(
                req_pool_indices[:bs],
                seq_lens[:bs],
                seq_lens_cpu[:bs],
                seq_lens_sum,
                decode_wrappers=self.decode_cuda_graph_metadata[bs],
                use_fast_plan=True,
            )
            return
        self.indices_updater_prefill.update(
            req_pool_indices[:bs],
            seq_lens[:bs],
            seq_lens_cpu[:bs],
            seq_lens_sum,
            prefix_lens=None,
            prefix_lens_cpu=None,
            prefill_wrappers=self.prefill_cuda_graph_metadata[bs],
            use_ragged=False,
            spec_num_draft_tokens=spec_num_draft_tokens,
        )
        if spec_info is not None and spec_info.draft_lens is not None:
            # ragged drafts: every request verifies its own number of tokens
            torch.cumsum(spec_info.draft_lens[:bs], 0, out=self.cuda_graph_qo_indptr[1 : bs + 1])  # expect: FC104

    def forward_decode(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        pool = forward_batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        kv = pool.get_kv_buffer(layer.layer_id)
        q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
        if layer.sliding_window_size is not None and layer.sliding_window_size > 0:
            o = self.window_decode_wrapper.run(q, kv)  # expect: FC108
        elif layer.logit_cap > 0:
            o = self._softcap_decode_wrapper().run(q, kv)  # expect: FC108
        else:
            o = self.forward_metadata.decode_wrappers[0].run(q, kv)  # ok: FC108
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        pool = forward_batch.token_to_kv_pool
        md = self.forward_metadata
        q = q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim)
        if not md.use_ragged:
            if save_kv_cache:
                pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
            o = md.prefill_wrappers[0].run(q, pool.get_kv_buffer(layer.layer_id))  # ok: FC108
            return o.view(-1, layer.tp_q_head_num * layer.head_dim)
        k = k.view(-1, layer.tp_k_head_num, layer.head_dim)
        v = v.view(-1, layer.tp_k_head_num, layer.head_dim)
        o, s = self.prefill_wrapper_ragged.run_return_lse(q, k, v)
        if not md.extend_no_prefix:
            o_prefix, s_prefix = md.prefill_wrappers[0].run_return_lse(q, pool.get_kv_buffer(layer.layer_id))
            o, _ = merge_state(o, s, o_prefix, s_prefix)
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)


class FlashInferIndicesUpdaterDecode:
    def __init__(self, model_runner: "ModelRunner", attn_backend: FlashInferAttnBackend):
        self.num_qo_heads = attn_backend.num_qo_heads
        self.num_kv_heads = attn_backend.num_kv_heads
        self.head_dim = attn_backend.head_dim
        self.data_type = attn_backend.data_type
        self.q_data_type = attn_backend.q_data_type
        self.req_to_token = attn_backend.req_to_token
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_indptr_cpu = attn_backend.kv_indptr_cpu
        self.kv_last_page_len = attn_backend.kv_last_page_len
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu

    def update(self, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, *, decode_wrappers, use_fast_plan=False):
        for wrapper in decode_wrappers:
            self.call_begin_forward(
                wrapper, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, use_fast_plan=use_fast_plan
            )

    def call_begin_forward(
        self,
        wrapper: BatchDecodeWithPagedKVCacheWrapper,
        req_pool_indices: torch.Tensor,
        paged_kernel_lens: torch.Tensor,
        paged_kernel_lens_cpu: torch.Tensor,
        paged_kernel_lens_sum: int,
        *,
        use_fast_plan: bool = False,
    ) -> None:
        bs = len(req_pool_indices)
        kv_indptr = self.kv_indptr
        kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)  # ok: FC104
        kv_indptr = kv_indptr[: bs + 1]
        if wrapper.is_cuda_graph_enabled:  # ok: FC103
            kv_indices = wrapper._paged_kv_indices_buf  # expect: FC103
        else:
            kv_indices = torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=req_pool_indices.device)
        gather_kv_slots_kernel[(bs,)](
            self.req_to_token,
            req_pool_indices,
            paged_kernel_lens,
            kv_indptr,
            kv_indices,
            self.req_to_token.shape[1],
            BLOCK=512,
        )
        if use_fast_plan:
            kv_indptr_cpu = self.kv_indptr_cpu[: bs + 1]
            kv_indptr_cpu[1:] = torch.cumsum(paged_kernel_lens_cpu, dim=0)
            fast_decode_plan(  # ok: FC102
                wrapper,
                kv_indptr_cpu,
                kv_indices,
                self.kv_last_page_len_cpu[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                1,
                q_data_type=self.q_data_type,
                kv_data_type=self.data_type,
                non_blocking=True,
            )
            return
        wrapper.begin_forward(  # expect: FC102
            kv_indptr,
            kv_indices,
            self.kv_last_page_len[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            q_data_type=self.q_data_type,
            kv_data_type=self.data_type,
        )


class FlashInferIndicesUpdaterPrefill:
    def __init__(self, model_runner: "ModelRunner", attn_backend: FlashInferAttnBackend):
        self.num_qo_heads = attn_backend.num_qo_heads
        self.num_kv_heads = attn_backend.num_kv_heads
        self.head_dim = attn_backend.head_dim
        self.data_type = attn_backend.data_type
        self.q_data_type = attn_backend.q_data_type
        self.req_to_token = attn_backend.req_to_token
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_indptr_cpu = attn_backend.kv_indptr_cpu
        self.qo_indptr_cpu = attn_backend.qo_indptr_cpu
        self.kv_last_page_len_cpu = attn_backend.kv_last_page_len_cpu
        self.prefill_wrapper_ragged = attn_backend.prefill_wrapper_ragged

    def update(
        self,
        req_pool_indices,
        seq_lens,
        seq_lens_cpu,
        seq_lens_sum,
        *,
        prefix_lens,
        prefix_lens_cpu,
        prefill_wrappers,
        use_ragged: bool,
        spec_num_draft_tokens: int = 0,
    ) -> None:
        bs = len(req_pool_indices)
        if use_ragged:
            paged_kernel_lens, paged_kernel_lens_cpu = prefix_lens, torch.tensor(prefix_lens_cpu, dtype=torch.int32)
            paged_kernel_lens_sum = sum(prefix_lens_cpu)
        else:
            paged_kernel_lens, paged_kernel_lens_cpu = seq_lens, seq_lens_cpu
            paged_kernel_lens_sum = seq_lens_sum
        qo_indptr_cpu = self.qo_indptr_cpu[: bs + 1]
        if spec_num_draft_tokens > 0:
            torch.arange(0, bs + 1, dtype=torch.int32, out=qo_indptr_cpu).mul_(spec_num_draft_tokens)
        else:
            extend_cpu = seq_lens_cpu - torch.tensor(prefix_lens_cpu, dtype=torch.int32)
            qo_indptr_cpu[1:] = torch.cumsum(extend_cpu, dim=0)
        kv_indptr_cpu = self.kv_indptr_cpu[: bs + 1]
        kv_indptr_cpu[1:] = torch.cumsum(paged_kernel_lens_cpu, dim=0)
        for wrapper in prefill_wrappers:
            kv_indptr = self.kv_indptr
            kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)
            if wrapper.is_cuda_graph_enabled:
                kv_indices = wrapper._paged_kv_indices_buf  # expect: FC103
            else:
                kv_indices = torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=req_pool_indices.device)
            gather_kv_slots_kernel[(bs,)](
                self.req_to_token,
                req_pool_indices,
                paged_kernel_lens,
                kv_indptr,
                kv_indices,
                self.req_to_token.shape[1],
                BLOCK=512,
            )
            wrapper.begin_forward(  # ok: FC102
                qo_indptr_cpu,
                kv_indptr_cpu,
                kv_indices,
                self.kv_last_page_len_cpu[:bs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                1,
                causal=True,
                q_data_type=self.q_data_type,
                kv_data_type=self.data_type,
            )
        if use_ragged:
            self.prefill_wrapper_ragged.begin_forward(
                qo_indptr_cpu,
                qo_indptr_cpu,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                causal=True,
                q_data_type=self.q_data_type,
            )
