"""FlashInfer attention with a tenant's pinned soft prompt attended through a separate prefill.

A decode row attends (1) its own pages through a decode wrapper and (2) its tenant's soft
prompt pages through a paged prefill wrapper with one query row per request; the two partial
outputs are merged with their log-sum-exps.  Extend batches do the same with a ragged
prefill over the new tokens.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)

from ptserve.layers.workspace import alloc_workspace
from ptserve.model_executor.forward_batch import ForwardBatch
from ptserve.server_args import PREFIX_WORKSPACE_MB, extend_workspace_bytes
from ptserve.tenancy.soft_prompts import SoftPromptRegistry

if TYPE_CHECKING:
    from ptserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_LAYOUT_ATTR = "_kv_layout"


@dataclass
class PTMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    prefix_wrapper: BatchPrefillWithPagedKVCacheWrapper


class PrefixTuningAttnBackend:
    def __init__(self, model_runner: "ModelRunner"):
        args = model_runner.server_args
        cfg = model_runner.model_config
        self.device = model_runner.device
        self.registry: SoftPromptRegistry = model_runner.registry
        self.kv_buffers = model_runner.kv_buffers
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.page_size = args.page_size
        self.max_pages_per_req = args.max_pages_per_req
        self.max_context_len = args.max_context_len
        self.kv_layout = "NHD"
        self.decode_backend = "trtllm-gen" if args.enable_trtllm_decode else "fa2"

        self.trtllm_workspace = torch.empty(args.flashinfer_workspace_size, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.prefix_workspace = torch.zeros(PREFIX_WORKSPACE_MB << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.extend_workspace = torch.zeros(extend_workspace_bytes(args, cfg), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.graph_workspace = alloc_workspace(args.graph_workspace_size, self.device, zeroed=args.zero_graph_workspace)

        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.trtllm_workspace, self.kv_layout, backend=self.decode_backend)
        self.prefix_eager = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, self.kv_layout)
        # the default soft prompt of tenants without their own never changes: planned once per size
        self.shared_prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, self.kv_layout)
        self.extend_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.extend_workspace, self.kv_layout)
        self.decode_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.prefix_graph: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[PTMetadata] = None
        self._shared_planned_bs: Optional[int] = None

    def _check_layout(self, w) -> None:
        if getattr(w, _LAYOUT_ATTR, "NHD") != self.kv_layout:  # expect: FC103
            raise RuntimeError("wrapper built with another KV layout")

    # -- eager steps -------------------------------------------------------------------

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if self.registry.total_pinned_pages > self.registry.pin_budget:
            logger.warning("pinned soft prompts exceed the reserved range")
        bs = fb.batch_size
        if fb.forward_mode.is_decode():
            qo_indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
            self.decode_eager.plan(
                fb.kv_indptr_cpu,
                fb.kv_indices,
                fb.kv_last_page_len_cpu,
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
            )
        else:
            qo_indptr_cpu = fb.extend_qo_indptr_cpu
            self.extend_ragged.plan(
                qo_indptr_cpu, qo_indptr_cpu, self.num_qo_heads, self.num_kv_heads, self.head_dim, causal=True
            )
            rows = torch.arange(bs, device=self.device)
            fb.token_req = torch.repeat_interleave(rows, fb.extend_seq_lens, output_size=fb.extend_num_tokens)  # ok: FC101
            token_tenant = torch.repeat_interleave(fb.tenant_ids, fb.extend_seq_lens)  # expect: FC101
            # user tokens sit after the tenant's virtual tokens
            fb.position_offsets = self.registry.num_virtual_tokens[token_tenant]
        if fb.all_shared_prompt:
            self._plan_shared_prompt(bs, qo_indptr_cpu)
        else:
            p_indptr, p_indices, p_last = self.registry.gather_pages(fb.tenant_ids_cpu)
            self.prefix_eager.plan(  # expect: FC102
                **dict(
                    qo_indptr=qo_indptr_cpu,
                    paged_kv_indptr=p_indptr,
                    paged_kv_indices=p_indices,
                    paged_kv_last_page_len=p_last,
                    num_qo_heads=self.num_qo_heads,
                    num_kv_heads=self.num_kv_heads,
                    head_dim_qk=self.head_dim,
                    page_size=self.page_size,
                    causal=False,
                )
            )
        self.forward_metadata = PTMetadata(self.decode_eager, self.prefix_eager)

    def _plan_shared_prompt(self, bs: int, qo_indptr_cpu: torch.Tensor) -> None:
        if self._shared_planned_bs == bs:
            return
        shared = torch.zeros(bs, dtype=torch.int32)
        p_indptr_cpu, p_indices, p_last_cpu = self.registry.gather_pages_host(shared, pad_to=bs)
        self.shared_prefix_wrapper.plan(
            qo_indptr_cpu,
            p_indptr_cpu,
            p_indices.to(self.device),
            p_last_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=False,
        )
        self._shared_planned_bs = bs

    # -- CUDA graphs -------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_bs * self.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.prefix_qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.prefix_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.prefix_kv_indices = torch.zeros(
            max_bs * self.registry.max_pages_per_tenant, dtype=torch.int32, device=self.device
        )
        self.prefix_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.prefix_qo_indptr_host = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        # one query row per request, for every captured size
        self.prefix_qo_indptr.copy_(self.prefix_qo_indptr_host, non_blocking=True)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        decode_w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            self.kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend=self.decode_backend,
        )
        prefix_w = BatchPrefillWithPagedKVCacheWrapper(
            self.prefix_workspace,
            self.kv_layout,
            use_cuda_graph=True,
            qo_indptr_buf=self.prefix_qo_indptr[: bs + 1],
            paged_kv_indptr_buf=self.prefix_kv_indptr[: bs + 1],
            paged_kv_indices_buf=self.prefix_kv_indices,
            paged_kv_last_page_len_buf=self.prefix_last_page_len[:bs],
        )
        for w in (decode_w, prefix_w):
            self._check_layout(w)
        self.decode_graph[bs] = decode_w
        self.prefix_graph[bs] = prefix_w
        self.init_forward_metadata_replay_cuda_graph(bs, bs, fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: ForwardBatch) -> None:
        if raw_bs > bs:
            raise ValueError(f"batch of {raw_bs} replayed on the graph for {bs}; seq_lens={fb.seq_lens}")  # ok: FC101
        max_len = fb.seq_lens_cpu.max().item()  # ok: FC101
        if max_len > self.max_context_len:
            raise ValueError(f"sequence of {max_len} tokens past max_context_len={self.max_context_len}")
        decode_w = self.decode_graph[bs]
        prefix_w = self.prefix_graph[bs]
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr_cpu[1 : raw_bs + 1] = fb.kv_indptr_cpu[1:]
        kv_indptr_cpu[raw_bs + 1 :] = fb.kv_indptr_cpu[-1]
        last_cpu = torch.ones(bs, dtype=torch.int32)
        last_cpu[:raw_bs] = fb.kv_last_page_len_cpu
        nnz = fb.kv_indices.shape[0]
        self.cuda_graph_kv_indices[:nnz].copy_(fb.kv_indices, non_blocking=True)
        decode_w.plan(  # ok: FC102
            kv_indptr_cpu,
            self.cuda_graph_kv_indices,
            last_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
        )
        # the tenants' soft-prompt pages
        p_indptr_cpu, p_indices_cpu, p_last_cpu = self.registry.gather_pages_host(fb.tenant_ids_cpu, pad_to=bs)
        pnnz = p_indices_cpu.shape[0]
        self.prefix_kv_indices[:pnnz].copy_(p_indices_cpu, non_blocking=True)  # ok: FC104
        prefix_w.plan(  # ok: FC102
            self.prefix_qo_indptr_host[: bs + 1],
            p_indptr_cpu,
            self.prefix_kv_indices,
            p_last_cpu,
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            causal=False,
        )
        # padded rows get empty query ranges
        self.prefix_qo_indptr[raw_bs + 1 : bs + 1] = raw_bs  # expect: FC104
        self.forward_metadata = PTMetadata(decode_w, prefix_w)

    # -- kernels -----------------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, layer, fb: ForwardBatch) -> torch.Tensor:
        md = self.forward_metadata
        kv = self.kv_buffers[layer.layer_id]
        o, lse = md.decode_wrapper.run(q, kv, return_lse=True)  # ok: FC108
        if fb.all_shared_prompt:
            po, plse = self.shared_prefix_wrapper.run(q, kv, return_lse=True)  # expect: FC108
        else:
            po, plse = md.prefix_wrapper.run(q, kv, return_lse=True)
        out, _ = merge_state(o, lse, po, plse)
        return out

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, fb: ForwardBatch) -> torch.Tensor:
        md = self.forward_metadata
        kv = self.kv_buffers[layer.layer_id]
        o, lse = self.extend_ragged.run(q, k, v, return_lse=True)
        if fb.all_shared_prompt:
            po, plse = self.shared_prefix_wrapper.run(q, kv, return_lse=True)
        else:
            po, plse = md.prefix_wrapper.run(q, kv, return_lse=True)
        out, _ = merge_state(o, lse, po, plse)
        return out
