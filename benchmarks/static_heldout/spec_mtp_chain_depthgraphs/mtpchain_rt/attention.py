"""FlashInfer attention for the target verify pass and the chained MTP depths.

Every (depth, graph batch size) pair owns a graph-mode decode wrapper bound to a row
of the per-depth buffers; the target verify pass and the draft tail run eager.
"""

import functools
import logging
from typing import Dict, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
    trtllm_batch_decode_with_kv_cache,
)

from mtpchain.config import DRAFT_WS_BYTES, MTPConfig
from mtpchain_rt.metadata import TailMetadata, TargetMetadata

logger = logging.getLogger(__name__)

_SCRATCH_ATTR = "_float_workspace_buffer"


class ChainAttention:
    def __init__(self, cfg: MTPConfig, kv_cache: torch.Tensor, device):
        self.cfg = cfg
        self.device = device
        self.kv_cache = kv_cache
        depth = cfg.num_mtp_heads
        max_bs = cfg.max_batch_size
        max_pages = cfg.max_batch_size * cfg.max_pages_per_seq

        self.shared_ws = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_ws = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.tail_ws = torch.zeros(DRAFT_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trt_ws = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105

        # per-depth graph buffers (device) and their pinned host mirrors
        self.kv_indptr = torch.zeros(depth, max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(depth, max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(depth, max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(depth, max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(depth, max_bs, dtype=torch.int32, pin_memory=True)
        self.init_graph_buffers()

        self.graph_wrappers: Dict[Tuple[int, int], BatchDecodeWithPagedKVCacheWrapper] = {}
        for d in range(depth):
            for bs in cfg.graph_batch_sizes:
                self.graph_wrappers[(d, bs)] = BatchDecodeWithPagedKVCacheWrapper(
                    self.shared_ws,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=True,
                    paged_kv_indptr_buffer=self.kv_indptr[d, : bs + 1],
                    paged_kv_indices_buffer=self.kv_indices[d],
                    paged_kv_last_page_len_buffer=self.kv_last_page_len[d, :bs],
                )

        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
        self.prompt_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
        self.tail_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.tail_ws, "NHD", use_tensor_cores=True)
        self._plan_tail = functools.partial(
            self.tail_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.cu_seqlens_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self._plan_info: Dict[Tuple[int, int], Tuple[int, int]] = {}

    # ------------------------------------------------------------------ setup
    def init_graph_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_cpu.zero_()

    def scratch_for_logits(self, nbytes: int) -> torch.Tensor:
        # borrow the verify wrapper's float workspace between plan() and run()
        scratch = getattr(self.verify_wrapper, _SCRATCH_ATTR)  # expect: FC103
        return scratch[:nbytes]

    # ------------------------------------------------------------- per step
    def plan_prompt(self, cu_seqlens_np, bs: int) -> None:
        self.cu_seqlens_cpu[: bs + 1] = torch.from_numpy(cu_seqlens_np)
        self.prompt_wrapper.plan(  # ok: FC102
            self.cu_seqlens_cpu[: bs + 1],
            self.cu_seqlens_cpu[: bs + 1],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            causal=True,
        )

    def plan_target_verify(self, meta: TargetMetadata) -> None:
        self.verify_wrapper.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.last_page_len_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def plan_tail(self, meta: TailMetadata) -> None:
        self._plan_tail(meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_device)  # expect: FC102

    def replay_prepare_depth(self, d: int, bs: int, indptr_np, indices: torch.Tensor, last_np) -> None:
        """Fill depth ``d``'s graph buffers for a padded batch of ``bs`` and plan its wrapper."""
        real = indptr_np.shape[0] - 1
        self.kv_indptr_cpu[d, : real + 1] = torch.from_numpy(indptr_np)
        self.kv_indptr_cpu[d, real + 1 : bs + 1] = self.kv_indptr_cpu[d, real]
        self.kv_last_page_len_cpu[d, :real] = torch.from_numpy(last_np)
        nnz = int(self.kv_indptr_cpu[d, bs])  # ok: FC101
        self.kv_indptr[d, : bs + 1].copy_(self.kv_indptr_cpu[d, : bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[d, :nnz].copy_(indices[:nnz], non_blocking=True)
        w = self.graph_wrappers[(d, bs)]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[d, : bs + 1],
            self.kv_indices[d, :nnz],
            self.kv_last_page_len_cpu[d, :bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )
        self._plan_info[(d, bs)] = (nnz, real)  # ok: FC103
        # padded rows attend one page of their own
        self.kv_last_page_len[d, real:bs].fill_(1)  # expect: FC104

    # ---------------------------------------------------------- attention
    def forward_depth(self, q: torch.Tensor, d: int, bs: int) -> torch.Tensor:
        layer = self.cfg.num_layers + d
        w = self.graph_wrappers[(d, bs)]
        o_chain, lse_chain = w.run_return_lse(q, self.kv_cache[layer])  # ok: FC108
        o_tail, lse_tail = self.tail_wrapper.run_return_lse(q, self.kv_cache[layer])  # expect: FC108
        o, _ = merge_state(o_chain, lse_chain, o_tail, lse_tail)
        return o

    def forward_verify(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.verify_wrapper.run(q, self.kv_cache[layer])

    def forward_prompt(self, q, k, v) -> torch.Tensor:
        return self.prompt_wrapper.run(q, k, v)

    def forward_target_trtllm(self, q, layer: int, block_tables, seq_lens, bs: int) -> torch.Tensor:
        # Blackwell path for the target verify pass (one token per request after the chain is cut)
        return trtllm_batch_decode_with_kv_cache(
            q,
            self.kv_cache[layer],
            self.trt_ws,
            block_tables[:bs],
            seq_lens[:bs],
            self.cfg.max_seq_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
        )
