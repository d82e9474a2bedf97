"""FlashInfer attention backend (SGLang's ``FlashInferAttnBackend``) whose metadata is built by Triton kernels.

Buffers:
  * ``kv_indptr`` / ``kv_last_page_len`` (device): filled on the device every step; views of them are bound
    to the graph-mode decode wrappers built at capture, together with ``cuda_graph_kv_indices``.
  * ``*_cpu`` (pinned): host mirrors of the same lengths, the only thing ``plan()`` should see.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING, Dict, List, Optional, Union

import torch
import triton
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.cascade import merge_state

from tkv_kernels.index_kernels import pad_kv_indptr_kernel
from tkv_kernels.trtllm_decode import TrtllmDecodePath
from tkvi.attention.indices_updater import FlashInferIndicesUpdaterDecode, FlashInferIndicesUpdaterPrefill
from tkvi.attention.workspace import alloc_workspace, get_global_workspace, ragged_workspace
from tkvi.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from tkvi.model import RadixAttention
    from tkvi.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# FlashInfer's fields for the buffers a graph-mode wrapper was built with; the capture records their addresses
# so the engine's debug report can show that plan() never moved them.
_GRAPH_BUFFER_FIELDS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


@dataclasses.dataclass
class DecodeMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    max_seq_len: int
    is_graph: bool = False


@dataclasses.dataclass
class PrefillMetadata:
    prefill_wrapper_paged: BatchPrefillWithPagedKVCacheWrapper
    use_ragged: bool
    extend_no_prefix: bool


def make_decode_wrapper(workspace_bytes, device, use_tensor_cores, backend):
    """An eager decode wrapper with a workspace of its own (the soft-capped layers plan with their own cap)."""
    workspace = alloc_workspace(workspace_bytes, device, zeroed=True)
    return BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=use_tensor_cores, backend=backend)


class AttentionBackend:
    """What the model runner, the graph runner and the attention layers see."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        raise NotImplementedError

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode):
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(self, bs, raw_bs, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, forward_mode):
        raise NotImplementedError

    def forward_decode(self, q, k, v, layer: "RadixAttention", forward_batch: ForwardBatch, save_kv_cache=True):
        raise NotImplementedError

    def forward_extend(self, q, k, v, layer: "RadixAttention", forward_batch: ForwardBatch, save_kv_cache=True):
        raise NotImplementedError


class FlashInferAttnBackend(AttentionBackend):
    def __init__(self, model_runner: "ModelRunner"):
        args = model_runner.server_args
        self.device = model_runner.device
        self.max_bs = args.max_running_requests
        self.max_context_len = args.max_context_len
        self.max_total_tokens = args.max_total_tokens
        self.num_qo_heads = args.num_attention_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        self.q_dtype = model_runner.dtype
        self.ragged_min_tokens = args.ragged_min_tokens
        self.sliding_window_size = args.sliding_window_size
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self._kv_layout = "NHD"  # ok: FC103
        self.decode_use_tensor_cores = self.num_qo_heads // self.num_kv_heads >= 4
        self.decode_backend = "trtllm-gen" if args.use_trtllm else "fa2"

        max_bs = self.max_bs
        self.kv_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_indptr_swa = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones((max_bs,), dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros((max_bs + 1,), dtype=torch.int32, device="cpu", pin_memory=True)
        self.qo_indptr_cpu = torch.zeros((max_bs + 1,), dtype=torch.int32, device="cpu", pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones((max_bs,), dtype=torch.int32, device="cpu", pin_memory=True)

        # eager wrappers
        self.workspace_buffer = get_global_workspace(self.device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer, self._kv_layout, use_tensor_cores=self.decode_use_tensor_cores
        )
        # layer groups past the first keep their own split-KV schedule
        self.group_decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper] = [
            BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, self._kv_layout, use_tensor_cores=True)
            for _ in range(args.num_kv_groups - 1)
        ]
        self.decode_workspace_bytes = max_bs * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (16 << 20)
        self.softcap_decode_wrappers: Dict[float, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._plan_softcap = None
        if args.logit_soft_cap > 0:
            w = make_decode_wrapper(self.decode_workspace_bytes, self.device, self.decode_use_tensor_cores, self.decode_backend)
            self.softcap_decode_wrappers[args.logit_soft_cap] = w
            self._plan_softcap = functools.partial(w.plan, logits_soft_cap=args.logit_soft_cap)
        self.decode_wrapper_swa = None
        if args.sliding_window_size > 0:
            self.swa_workspace = torch.empty(args.swa_workspace_mb << 20, dtype=torch.uint8, device=self.device)  # expect: FC105  # ok: FC106
            self.decode_wrapper_swa = BatchDecodeWithPagedKVCacheWrapper(
                self.swa_workspace, self._kv_layout, use_tensor_cores=self.decode_use_tensor_cores, backend=self.decode_backend
            )
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace(self.device), self._kv_layout)
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(
            alloc_workspace(args.prefill_workspace_mb << 20, self.device), self._kv_layout
        )

        self.trtllm_decode: Optional[TrtllmDecodePath] = None
        if args.use_trtllm:
            sm_major = torch.cuda.get_device_capability(self.device)[0]
            self.trtllm_decode = TrtllmDecodePath(
                self.req_to_token, args.page_size, max_bs, args.max_context_len, self.device, sm_major
            )

        self.indices_updater_decode = FlashInferIndicesUpdaterDecode(model_runner, self)
        self.indices_updater_prefill = FlashInferIndicesUpdaterPrefill(model_runner, self)
        self.forward_metadata: Optional[Union[DecodeMetadata, PrefillMetadata]] = None

        # graph state, filled by init_cuda_graph_state / the capture
        self.cuda_graph_kv_indices = None
        self.cuda_graph_workspace = None
        self.decode_cuda_graph_metadata: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.bound_buffer_ptrs: Dict[int, Dict[str, int]] = {}

    # ------------------------------------------------------------------ eager steps

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        bs = forward_batch.batch_size
        if forward_batch.forward_mode.is_decode():
            kv_indptr_cpu, kv_indices = self.indices_updater_decode.update(
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                forward_batch.seq_lens_cpu,
                forward_batch.seq_lens_sum,
                self.decode_wrapper,
            )
            # the other decode wrappers reuse the page ids the kernel just wrote
            if self._plan_softcap is not None:
                self._plan_softcap(  # ok: FC102
                    kv_indptr_cpu,
                    kv_indices,
                    self.kv_last_page_len_cpu[:bs],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    1,
                    q_data_type=self.q_dtype,
                )
            for w in self.group_decode_wrappers:
                w.plan(
                    kv_indptr_cpu,
                    kv_indices,
                    self.kv_last_page_len_cpu[:bs],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    1,
                    q_data_type=self.q_dtype,
                )
            if self.decode_wrapper_swa is not None:
                self.indices_updater_decode.update_sliding_window(
                    forward_batch.req_pool_indices, forward_batch.seq_lens, self.sliding_window_size, self.decode_wrapper_swa
                )
            self.forward_metadata = DecodeMetadata(self.decode_wrapper, max_seq_len=int(forward_batch.seq_lens_cpu.max()))  # ok: FC101
        else:
            use_ragged = forward_batch.extend_num_tokens >= self.ragged_min_tokens
            extend_no_prefix = not any(forward_batch.extend_prefix_lens_cpu)  # ok: FC101
            forward_batch.kv_indices = torch.empty(forward_batch.seq_lens_sum + 1, dtype=torch.int32, device=self.device)  # ok: FC107
            self.indices_updater_prefill.update(
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                forward_batch.seq_lens_cpu,
                forward_batch.extend_prefix_lens,
                forward_batch.extend_prefix_lens_cpu,
                forward_batch.extend_seq_lens,
                forward_batch.extend_seq_lens_cpu,
                forward_batch.kv_indices,
                self.prefill_wrapper_paged,
                use_ragged,
            )
            self.forward_metadata = PrefillMetadata(self.prefill_wrapper_paged, use_ragged, extend_no_prefix)

    # ------------------------------------------------------------------ CUDA graphs

    def cuda_graph_workspace_bytes(self, max_bs: int) -> int:
        return max_bs * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (32 << 20)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        assert self.kv_indptr.dtype == torch.int32, "FlashInfer's indptr buffers are int32"  # ok: FC109
        # one id per KV slot of the pool is enough unless requests share prefix pages
        num_kv_ids = min(max_bs * self.max_context_len, self.max_total_tokens)
        self.cuda_graph_kv_indices = torch.zeros((num_kv_ids,), dtype=torch.int32, device=self.device)
        # graph wrappers may run on trtllm-gen, which keeps counters in its workspace
        self.cuda_graph_workspace = torch.empty(self.cuda_graph_workspace_bytes(max_bs), dtype=torch.uint8, device=self.device)  # ok: FC105, FC106
        self.cuda_graph_workspace.zero_()

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode):
        if not forward_mode.is_decode():
            raise NotImplementedError("only decode batches are captured")
        decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.cuda_graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=self.decode_use_tensor_cores,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend=self.decode_backend,
        )
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        seq_lens_sum = int(seq_lens_cpu[:bs].sum())
        self.indices_updater_decode.update(req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, decode_wrapper)

        ptrs = {}
        for name in _GRAPH_BUFFER_FIELDS:
            ptrs[name] = getattr(decode_wrapper, name).data_ptr()  # expect: FC103
        self.bound_buffer_ptrs[bs] = ptrs
        self.decode_cuda_graph_metadata[bs] = decode_wrapper
        self.forward_metadata = DecodeMetadata(decode_wrapper, max_seq_len=int(seq_lens.max()), is_graph=True)  # expect: FC101

    def init_forward_metadata_replay_cuda_graph(self, bs, raw_bs, req_pool_indices, seq_lens, seq_lens_cpu, seq_lens_sum, forward_mode):
        if seq_lens_sum > self.cuda_graph_kv_indices.numel():
            # requests sharing prefix pages can reference more ids than the pool holds
            self.cuda_graph_kv_indices.resize_(seq_lens_sum)  # expect: FC107
        decode_wrapper = self.decode_cuda_graph_metadata[bs]
        if decode_wrapper._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} was built for another batch size")
        self.indices_updater_decode.update(
            req_pool_indices[:bs], seq_lens[:bs], seq_lens_cpu[:bs], seq_lens_sum, decode_wrapper
        )
        if raw_bs < bs:
            # padded rows attend to nothing
            pad_kv_indptr_kernel[(1,)](self.kv_indptr, raw_bs, bs, BLOCK=triton.next_power_of_2(bs))  # expect: FC104
        self.forward_metadata = DecodeMetadata(decode_wrapper, max_seq_len=self.max_context_len, is_graph=True)

    # ------------------------------------------------------------------ attention

    def forward_decode(self, q, k, v, layer: "RadixAttention", forward_batch: ForwardBatch, save_kv_cache=True):
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        kv = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        bs = forward_batch.batch_size

        if self.trtllm_decode is not None:
            o = self.trtllm_decode.decode(
                q, kv, forward_batch.req_pool_indices, forward_batch.seq_lens, self.forward_metadata.max_seq_len, bs, layer.scaling
            )
        elif layer.sliding_window_size > 0:
            # window lengths for this layer's kernel
            window_lens = torch.clamp(forward_batch.seq_lens, max=layer.sliding_window_size)
            torch.cumsum(window_lens, dim=0, dtype=torch.int32, out=self.kv_indptr[1 : bs + 1])  # expect: FC104
            o = self.decode_wrapper_swa.run(q, kv)  # expect: FC108
        elif layer.logit_cap > 0:
            o = self.softcap_decode_wrappers[layer.logit_cap].run(q, kv)  # expect: FC108
        elif layer.kv_group > 0:
            o = self.group_decode_wrappers[layer.kv_group - 1].run(q, kv)  # expect: FC108
        elif layer.needs_lse:
            w = self.decode_cuda_graph_metadata[bs] if self.forward_metadata.is_graph else self.decode_wrapper
            o, lse = w.run_return_lse(q, kv)  # ok: FC108
            o = layer.merge_sink(o, lse)
        else:
            o = self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def forward_extend(self, q, k, v, layer: "RadixAttention", forward_batch: ForwardBatch, save_kv_cache=True):
        meta = self.forward_metadata
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        k = k.view(-1, layer.tp_k_head_num, layer.head_dim)
        v = v.view(-1, layer.tp_k_head_num, layer.head_dim)
        kv = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)

        if meta.use_ragged and meta.extend_no_prefix:
            o = self.prefill_wrapper_ragged.forward(q, k, v, causal=True, sm_scale=layer.scaling)  # ok: FC108
        elif meta.use_ragged:
            o1, s1 = self.prefill_wrapper_ragged.forward_return_lse(q, k, v, causal=True, sm_scale=layer.scaling)
            o2, s2 = meta.prefill_wrapper_paged.forward_return_lse(q, kv, causal=False, sm_scale=layer.scaling)
            o, _ = merge_state(o1, s1, o2, s2)
        else:
            o = meta.prefill_wrapper_paged.run(q, kv)
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def debug_report(self) -> Dict[str, object]:
        """Plan bookkeeping for the /debug endpoint."""
        return {
            "last_decode_plan": self.indices_updater_decode.last_plan(),
            "graph_buffer_ptrs": self.bound_buffer_ptrs,
            "kv_layout": self._kv_layout,
        }
