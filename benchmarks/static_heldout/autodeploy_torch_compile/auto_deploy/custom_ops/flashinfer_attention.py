"""FlashInfer attention as a torch custom op, and the process-wide planner behind it."""

from typing import Dict, Optional, Tuple

import flashinfer
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from auto_deploy.custom_ops.attention_interface import PlanParams


class _FlashInferPlanner:
    """Owns the wrappers of the process and re-plans them only when the plan parameters change."""

    def __init__(self) -> None:
        self.float_workspace: Optional[torch.Tensor] = None
        self.trtllm_workspace: Optional[torch.Tensor] = None
        self.ctx_workspace: Optional[torch.Tensor] = None
        self.prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self.decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self.graph_decode_wrappers: Dict[PlanParams, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.plan_params: Optional[PlanParams] = None
        # set while the graphs of one decode bucket are warmed up and captured
        self.graph_bucket: Optional[int] = None
        self.trtllm_ctx_min_tokens = 8192

    @property
    def use_trtllm_decode(self) -> bool:
        return self.trtllm_workspace is not None

    def init_workspace(
        self,
        float_workspace: torch.Tensor,
        *,
        trtllm_workspace: Optional[torch.Tensor] = None,
        ctx_workspace: Optional[torch.Tensor] = None,
    ) -> None:
        self.__init__()
        self.float_workspace = float_workspace
        self.trtllm_workspace = trtllm_workspace
        self.ctx_workspace = ctx_workspace
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(float_workspace, "NHD")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(float_workspace, "NHD", use_tensor_cores=True)

    def reset(self) -> None:
        self.plan_params = None

    def _graph_wrapper(
        self,
        params: PlanParams,
        kv_page_indptr: torch.Tensor,
        kv_page_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
    ) -> BatchDecodeWithPagedKVCacheWrapper:
        wrapper = self.graph_decode_wrappers.get(params)
        if wrapper is not None and wrapper._fixed_batch_size == params.num_seqs:  # expect: FC103
            return wrapper
        assert self.float_workspace is not None, "init_workspace() must run first"  # ok: FC109
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=kv_page_indptr,
            paged_kv_indices_buffer=kv_page_indices,
            paged_kv_last_page_len_buffer=kv_last_page_len,
        )
        self.graph_decode_wrappers[params] = wrapper
        return wrapper

    def plan(
        self,
        *,
        qo_indptr_host: torch.Tensor,
        kv_page_indptr: torch.Tensor,
        kv_page_indptr_host: torch.Tensor,
        kv_page_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        kv_last_page_len_host: torch.Tensor,
        plan_params: PlanParams,
        for_graph: bool = False,
    ):
        def _plan_decode(wrapper: BatchDecodeWithPagedKVCacheWrapper) -> None:
            wrapper.plan(  # expect: FC102
                kv_page_indptr,
                kv_page_indices,
                kv_last_page_len_host,
                plan_params.n_heads,
                plan_params.n_kv_heads,
                plan_params.head_dim,
                plan_params.page_size,
                q_data_type=plan_params.q_dtype,
                kv_data_type=plan_params.kv_dtype,
                sm_scale=plan_params.sm_scale,
            )

        if plan_params.is_generate and (for_graph or self.graph_bucket is not None):
            # graph-mode wrappers are bound to SequenceInfo's arrays and re-planned before every replay
            wrapper = self._graph_wrapper(plan_params, kv_page_indptr, kv_page_indices, kv_last_page_len)
            _plan_decode(wrapper)
            return wrapper
        if plan_params == self.plan_params:
            return self.decode_wrapper if plan_params.is_generate else self.prefill_wrapper
        if plan_params.is_generate:
            _plan_decode(self.decode_wrapper)
        else:
            self.prefill_wrapper.plan(  # ok: FC102
                qo_indptr_host,
                kv_page_indptr_host,
                kv_page_indices,
                kv_last_page_len_host,
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
        return self.decode_wrapper if plan_params.is_generate else self.prefill_wrapper


_PLANNER = _FlashInferPlanner()


def get_planner() -> _FlashInferPlanner:
    return _PLANNER


@torch.library.custom_op("auto_deploy::flashinfer_mha_with_cache", mutates_args=("k_cache", "v_cache"))
def flashinfer_mha_with_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch_info_host: torch.Tensor,
    qo_indptr: torch.Tensor,
    qo_indptr_host: torch.Tensor,
    cu_num_pages: torch.Tensor,
    cu_num_pages_host: torch.Tensor,
    cache_loc: torch.Tensor,
    page_table: torch.Tensor,
    last_page_len: torch.Tensor,
    last_page_len_host: torch.Tensor,
    seq_len: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: Optional[float],
    head_dim: int,
    page_size: int,
) -> torch.Tensor:
    assert k_cache.dim() == 4, "paged cache must be [pages, page_size, kv_heads, head_dim]"  # expect: FC109
    num_prefill = int(batch_info_host[0])  # ok: FC101
    num_prefill_tokens = int(batch_info_host[1])
    num_decode = int(batch_info_host[2])
    num_seqs = num_prefill + num_decode
    num_tokens = q.shape[0]
    q = q.view(num_tokens, -1, head_dim)
    k = k.view(num_tokens, -1, head_dim)
    v = v.view(num_tokens, -1, head_dim)

    # append this step's keys and values to their pages
    batch_indices, positions = flashinfer.get_batch_indices_positions(qo_indptr[: num_seqs + 1], seq_len[:num_seqs], num_tokens)
    flashinfer.append_paged_kv_cache(
        k, v, batch_indices, positions, (k_cache, v_cache), cache_loc, cu_num_pages[: num_seqs + 1], last_page_len[:num_seqs], kv_layout="NHD"
    )

    planner = get_planner()
    sm_scale = scale if scale is not None else head_dim**-0.5
    if num_prefill == 0 and planner.use_trtllm_decode:
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=(k_cache, v_cache),
            workspace_buffer=planner.trtllm_workspace,
            block_tables=page_table[:num_seqs],
            seq_lens=seq_len[:num_seqs],
            max_seq_len=int(seq_len.max()),  # expect: FC101
            bmm1_scale=sm_scale,
            bmm2_scale=1.0,
        ).view(num_tokens, -1)
    if num_decode == 0 and planner.ctx_workspace is not None and num_prefill_tokens >= planner.trtllm_ctx_min_tokens:
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=(k_cache, v_cache),
            workspace_buffer=planner.ctx_workspace,
            block_tables=page_table[:num_seqs],
            seq_lens=seq_len[:num_seqs],
            max_q_len=num_prefill_tokens,
            max_kv_len=k_cache.shape[0] * page_size,
            bmm1_scale=sm_scale,
            bmm2_scale=1.0,
            batch_size=num_seqs,
            cum_seq_lens_q=qo_indptr[: num_seqs + 1],
            cum_seq_lens_kv=cu_num_pages[: num_seqs + 1] * page_size,
        ).view(num_tokens, -1)

    params = PlanParams(
        num_seqs=num_seqs,
        n_heads=q.shape[1],
        n_kv_heads=k_cache.shape[2],
        head_dim=head_dim,
        page_size=page_size,
        is_generate=num_prefill == 0,
        q_dtype=q.dtype,
        kv_dtype=k_cache.dtype,
        sm_scale=sm_scale,
    )
    wrapper = planner.plan(
        qo_indptr_host=qo_indptr_host[: num_seqs + 1],
        kv_page_indptr=cu_num_pages[: num_seqs + 1],
        kv_page_indptr_host=cu_num_pages_host[: num_seqs + 1],
        kv_page_indices=cache_loc,
        kv_last_page_len=last_page_len[:num_seqs],
        kv_last_page_len_host=last_page_len_host[:num_seqs],
        plan_params=params,
    )
    return wrapper.run(q, (k_cache, v_cache)).view(num_tokens, -1)


@flashinfer_mha_with_cache.register_fake
def _flashinfer_mha_with_cache_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch_info_host: torch.Tensor,
    qo_indptr: torch.Tensor,
    qo_indptr_host: torch.Tensor,
    cu_num_pages: torch.Tensor,
    cu_num_pages_host: torch.Tensor,
    cache_loc: torch.Tensor,
    page_table: torch.Tensor,
    last_page_len: torch.Tensor,
    last_page_len_host: torch.Tensor,
    seq_len: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: Optional[float],
    head_dim: int,
    page_size: int,
) -> torch.Tensor:
    return torch.empty_like(q)
