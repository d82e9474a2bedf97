"""FlashInfer cached attention for AutoDeploy: a global planner, a metadata op and the attention op."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Dict, List, Optional, Tuple, Union

import flashinfer
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from torch.fx import Node

from auto_deploy.custom_ops.attention_interface import (
    AttentionDescriptor,
    AttentionRegistry,
    BufferInitializerDict,
    CacheInitializerDict,
    SequenceInfo,
)
from auto_deploy.utils.cuda_graph import cuda_graph_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanParams:
    n_heads: int
    n_kv_heads: int
    head_dim: int
    num_seq: int
    is_generate: bool
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    sm_scale: Optional[float] = None

    def __hash__(self):
        return hash(tuple(getattr(self, f.name) for f in fields(self)))


class _FlashInferPlanner:
    workspace_buffer: Optional[torch.Tensor]
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper]
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    cached_cuda_graph_decode_wrappers: Dict[PlanParams, BatchDecodeWithPagedKVCacheWrapper]
    plan_params: Optional[PlanParams]

    def __init__(self):
        self.workspace_buffer = None
        self.prefill_wrapper = None
        self.decode_wrapper = None
        self.cached_cuda_graph_decode_wrappers = {}
        self.plan_params = None

    def _init_decode_wrapper(self, use_cuda_graph: bool = False, indptr=None, indices=None, last_page_len=None):
        return BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer,
            "NHD",
            use_cuda_graph=use_cuda_graph,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last_page_len,
            use_tensor_cores=True,
        )

    def init_workspace(self, workspace_buffer: torch.Tensor):
        self.workspace_buffer = workspace_buffer
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", backend="fa2")
        self.decode_wrapper = self._init_decode_wrapper()

    def reset(self) -> None:
        self.plan_params = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_page_indptr: torch.Tensor,
        kv_page_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        plan_params: PlanParams,
        host_indptr: Optional[torch.Tensor] = None,
        host_last_page_len: Optional[torch.Tensor] = None,
    ) -> Union[BatchPrefillWithPagedKVCacheWrapper, BatchDecodeWithPagedKVCacheWrapper]:
        def _plan_decode(wrapper: BatchDecodeWithPagedKVCacheWrapper):
            if host_indptr is not None:
                wrapper.plan(  # ok: FC102
                    host_indptr,
                    kv_page_indices,
                    host_last_page_len,
                    plan_params.n_heads,
                    plan_params.n_kv_heads,
                    plan_params.head_dim,
                    plan_params.page_size,
                    q_data_type=plan_params.q_dtype,
                    kv_data_type=plan_params.kv_dtype,
                    sm_scale=plan_params.sm_scale,
                )
            else:
                wrapper.plan(  # expect: FC102
                    kv_page_indptr,
                    kv_page_indices,
                    kv_last_page_len,
                    plan_params.n_heads,
                    plan_params.n_kv_heads,
                    plan_params.head_dim,
                    plan_params.page_size,
                    q_data_type=plan_params.q_dtype,
                    kv_data_type=plan_params.kv_dtype,
                    sm_scale=plan_params.sm_scale,
                )

        # graph-mode decode wrappers are created (and bound to these buffers) during warm-up only
        if cuda_graph_state.in_warm_up() and plan_params.is_generate:
            if plan_params not in self.cached_cuda_graph_decode_wrappers:
                self.cached_cuda_graph_decode_wrappers[plan_params] = self._init_decode_wrapper(
                    use_cuda_graph=True, indptr=kv_page_indptr, indices=kv_page_indices, last_page_len=kv_last_page_len
                )
            _plan_decode(self.cached_cuda_graph_decode_wrappers[plan_params])
        if torch.cuda.is_current_stream_capturing() or cuda_graph_state.in_warm_up():
            return self.cached_cuda_graph_decode_wrappers[plan_params]

        wrapper = self.decode_wrapper if plan_params.is_generate else self.prefill_wrapper
        # decode steps with an unchanged batch shape re-use the previous plan
        if plan_params == self.plan_params and wrapper._plan_info is not None:  # expect: FC103
            return wrapper
        if plan_params.is_generate:
            _plan_decode(self.decode_wrapper)
        else:
            self.prefill_wrapper.plan(  # expect: FC102
                qo_indptr,
                kv_page_indptr,
                kv_page_indices,
                kv_last_page_len,
                plan_params.n_heads,
                plan_params.n_kv_heads,
                plan_params.head_dim,
                plan_params.page_size,
                causal=True,
                q_data_type=plan_params.q_dtype,
                kv_data_type=plan_params.kv_dtype,
                sm_scale=plan_params.sm_scale,
            )
        self.plan_params = plan_params
        return wrapper


_GlobalFlashInferPlanner = _FlashInferPlanner()


@torch.library.custom_op("auto_deploy::flashinfer_attention_prepare_metadata", mutates_args=())
def prepare_flashinfer_metadata(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    seq_len: torch.Tensor,
    input_pos: torch.Tensor,
    cache_loc: torch.Tensor,
    pages_per_seq: torch.Tensor,
    page_size: int,
) -> List[torch.Tensor]:
    _GlobalFlashInferPlanner.reset()
    num_seq = SequenceInfo._get_sanitized_num_sequences(input_ids, seq_len)
    qo_indptr = torch.zeros(num_seq + 1, dtype=torch.int, device=seq_len.device)
    qo_indptr[1:] = torch.cumsum(seq_len[:num_seq], 0)
    paged_kv_indptr = torch.zeros_like(qo_indptr)
    paged_kv_indptr[1:] = torch.cumsum(pages_per_seq[:num_seq], 0)
    paged_kv_last_page_len = ((input_pos + seq_len - 1) % page_size) + 1
    batch_indices, positions = flashinfer.get_batch_indices_positions(
        qo_indptr,
        flashinfer.get_seq_lens(paged_kv_indptr, paged_kv_last_page_len[:num_seq], page_size),
        position_ids.numel(),
    )
    return [qo_indptr, paged_kv_indptr, cache_loc, paged_kv_last_page_len[:num_seq], batch_indices, positions]


@prepare_flashinfer_metadata.register_fake
def _prepare_flashinfer_metadata_fake(input_ids, position_ids, seq_len, input_pos, cache_loc, pages_per_seq, page_size):
    n = seq_len.shape[0]
    qo_indptr = torch.empty(n + 1, dtype=torch.int, device=seq_len.device)
    return [qo_indptr, torch.empty_like(qo_indptr), torch.empty_like(cache_loc), torch.empty_like(seq_len),
            torch.empty_like(input_ids.flatten()), torch.empty_like(input_ids.flatten())]


@torch.library.custom_op("auto_deploy::flashinfer_attention_mha_with_cache", mutates_args=())
def flashinfer_mha_with_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qo_indptr: torch.Tensor,
    paged_kv_indptr: torch.Tensor,
    paged_kv_indices: torch.Tensor,
    paged_kv_last_page_len: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    qo_indptr_host: Optional[torch.Tensor],
    paged_kv_indptr_host: Optional[torch.Tensor],
    paged_kv_last_page_len_host: Optional[torch.Tensor],
    scale: Optional[float],
    k_scale: float,
    v_scale: float,
) -> torch.Tensor:
    head_dim = k_cache.shape[-1]
    q_shape_og = q.shape
    b, s = q_shape_og[:2]
    q = q.reshape(b * s, -1, head_dim)
    k = k.reshape(b * s, -1, head_dim)
    v = v.reshape(b * s, -1, head_dim)
    num_seq = int(qo_indptr.shape[0]) - 1  # ok: FC101
    n_heads = q.shape[1]
    n_kv_heads = k.shape[1]
    flashinfer.page.append_paged_kv_cache(
        k, v, batch_indices, positions, (k_cache, v_cache), paged_kv_indices, paged_kv_indptr, paged_kv_last_page_len
    )
    pp = PlanParams(
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        num_seq=num_seq,
        is_generate=(s == 1),
        page_size=k_cache.shape[1],
        q_dtype=q.dtype,
        kv_dtype=k_cache.dtype,
        sm_scale=scale,
    )
    wrapper = _GlobalFlashInferPlanner.plan(
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        pp,
        host_indptr=paged_kv_indptr_host,
        host_last_page_len=paged_kv_last_page_len_host,
    )
    y = wrapper.run(q, (k_cache, v_cache), k_scale=k_scale, v_scale=v_scale)
    return y.view(q_shape_og)


@flashinfer_mha_with_cache.register_fake
def _flashinfer_mha_with_cache_fake(q, k, v, *args) -> torch.Tensor:
    return torch.empty_like(q.contiguous())


@AttentionRegistry.register("flashinfer")
class FlashInferAttention(AttentionDescriptor):
    @classmethod
    def _get_planner(cls) -> _FlashInferPlanner:
        return _GlobalFlashInferPlanner

    @classmethod
    def get_cached_attention_op(cls):
        return torch.ops.auto_deploy.flashinfer_attention_mha_with_cache

    @classmethod
    def get_prepare_metadata_op(cls) -> Tuple:
        return torch.ops.auto_deploy.flashinfer_attention_prepare_metadata, 6

    @classmethod
    def get_cache_initializers(cls, source_attn_node: Node) -> CacheInitializerDict:
        k_fake = source_attn_node.args[1].meta["val"]

        def _get_cache(si: SequenceInfo):
            return torch.empty(si.num_pages, si.page_size, k_fake.shape[2], k_fake.shape[3], device=si.device, dtype=k_fake.dtype)

        return {"k_cache": _get_cache, "v_cache": _get_cache}

    @classmethod
    def get_global_buffer_initializers(cls, source_attn_node: Node) -> BufferInitializerDict:
        def _init_workspace(si: SequenceInfo) -> torch.Tensor:
            # a fixed size keeps many graph sizes from running out of memory
            buffer = torch.empty(320 * 1024 * 1024, device=si.device, dtype=torch.uint8)  # expect: FC106  # ok: FC105
            cls._get_planner().init_workspace(buffer)
            return buffer

        return {"workspace_buffer": _init_workspace}
