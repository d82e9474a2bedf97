"""Attention metadata built outside the compiled region: every FlashInfer plan() of the engine happens here."""
from __future__ import annotations

import bisect
import dataclasses
import logging
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from cpo_engine.config import PREFILL_WORKSPACE_BYTES, SUPPORTED_PAGE_SIZES, EngineConfig, KVCacheSpec, get_decode_workspace
from cpo_engine.ops.attention_ops import bind_step_wrappers

logger = logging.getLogger(__name__)


@triton.jit
def _block_table_to_indices(block_table_ptr, kv_indptr_ptr, kv_indices_ptr, stride: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.load(kv_indptr_ptr + row)
    n = tl.load(kv_indptr_ptr + row + 1) - start
    for off in range(0, n, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        blocks = tl.load(block_table_ptr + row * stride + offs, mask=offs < n)
        tl.store(kv_indices_ptr + start + offs, blocks, mask=offs < n)


@dataclasses.dataclass
class CommonAttentionMetadata:
    num_reqs: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


@dataclasses.dataclass
class AttnStepMetadata:
    """Passed into the compiled forward: ints (dynamo guards on them) and tensors only."""

    num_decodes: int
    num_decode_tokens: int
    num_prefill_tokens: int
    padded_tokens: int
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    paged_kv_last_page_len: torch.Tensor


class FlashInferMetadataBuilder:
    """Decode-only batches use the decode wrappers (graph-mode up to the largest capture size); any batch with a
    prefill runs every row through the paged prefill wrapper."""

    def __init__(self, cfg: EngineConfig, kv_spec: KVCacheSpec, device: torch.device):
        assert kv_spec.page_size in SUPPORTED_PAGE_SIZES, f"unsupported page size {kv_spec.page_size}"  # expect: FC109
        self.cfg = cfg
        self.device = device
        self.page_size = kv_spec.page_size
        self.heads = (cfg.num_q_heads, kv_spec.num_kv_heads, kv_spec.head_dim)
        self.capture_sizes = sorted(cfg.capture_sizes)
        self._kv_layout = "NHD"
        self.decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        max_reqs = cfg.max_num_seqs

        decode_ws = get_decode_workspace(cfg.max_num_batched_tokens, cfg.num_q_heads, torch.cuda.current_device())
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_workspace = torch.zeros(cfg.graph_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self._eager_decode = BatchDecodeWithPagedKVCacheWrapper(decode_ws, self._kv_layout, backend=self.decode_backend)
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self._plan_prefill = self._prefill.plan
        self._graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        self.paged_kv_indptr = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indices = torch.zeros(kv_spec.num_blocks, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_dev: Optional[torch.Tensor] = None

    def init_graph_buffers(self) -> None:
        self.paged_kv_last_page_len.fill_(1)  # ok: FC104

    def padded_size(self, num_decodes: int) -> Optional[int]:
        i = bisect.bisect_left(self.capture_sizes, num_decodes)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def graph_decode_wrappers(self) -> Dict[int, BatchDecodeWithPagedKVCacheWrapper]:
        return self._graph_decode

    def _get_graph_decode(self, n: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = self._graph_decode.get(n)
        if w is None:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,  # ok: FC103
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: n + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:n],
                backend=self.decode_backend,
            )
            self._graph_decode[n] = w
        return w

    def build(self, common: CommonAttentionMetadata) -> AttnStepMetadata:
        num_reqs = common.num_reqs
        query_lens = common.query_start_loc[1:] - common.query_start_loc[:-1]
        num_decodes = int((query_lens == 1).sum())  # expect: FC101
        num_tokens = int(common.query_start_loc_cpu[-1])  # ok: FC101
        if num_decodes < num_reqs:
            # mixed batch: the prefill wrapper takes the one-token rows too (one graph per token count)
            num_decodes = 0
        num_prefill_tokens = num_tokens - num_decodes
        padded = self.padded_size(num_decodes) if num_prefill_tokens == 0 else None

        pages_cpu = (common.seq_lens_cpu + self.page_size - 1) // self.page_size
        torch.cumsum(pages_cpu, dim=0, out=self.paged_kv_indptr_cpu[1 : num_reqs + 1])
        self.paged_kv_last_page_len_cpu[:num_reqs] = (common.seq_lens_cpu - 1) % self.page_size + 1
        self.paged_kv_indptr[: num_reqs + 1].copy_(self.paged_kv_indptr_cpu[: num_reqs + 1], non_blocking=True)  # ok: FC104
        _block_table_to_indices[(num_reqs,)](
            common.block_table, self.paged_kv_indptr, self.paged_kv_indices, common.block_table.stride(0), BLOCK=128
        )
        self.seq_lens_dev = common.seq_lens.clone()  # expect: FC107

        decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        if num_decodes > 0 and padded is not None:
            decode_wrapper = self._get_graph_decode(padded)
            self.paged_kv_indptr_cpu[num_reqs + 1 : padded + 1] = self.paged_kv_indptr_cpu[num_reqs]
            self.paged_kv_last_page_len_cpu[num_reqs:padded] = 1
            decode_wrapper.plan(  # ok: FC102
                self.paged_kv_indptr_cpu[: padded + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:padded],
                *self.heads, self.page_size,
            )
        elif num_decodes > 0:
            decode_wrapper = self._eager_decode
            decode_args = dict(
                indptr=self.paged_kv_indptr_cpu[: num_decodes + 1],
                indices=self.paged_kv_indices,
                last_page_len=self.paged_kv_last_page_len[:num_decodes],
                num_qo_heads=self.heads[0],
                num_kv_heads=self.heads[1],
                head_dim=self.heads[2],
                page_size=self.page_size,
            )
            self._eager_decode.plan(**decode_args)  # expect: FC102
        if num_prefill_tokens > 0:
            self._plan_prefill(  # expect: FC102
                common.query_start_loc, self.paged_kv_indptr_cpu[: num_reqs + 1], self.paged_kv_indices,
                self.paged_kv_last_page_len_cpu[:num_reqs], *self.heads, self.page_size, causal=True,
            )
        bind_step_wrappers(decode_wrapper, self._prefill)
        rows = padded or num_reqs
        return AttnStepMetadata(
            num_decodes=num_decodes,
            num_decode_tokens=padded or num_decodes,
            num_prefill_tokens=num_prefill_tokens,
            padded_tokens=padded or num_tokens,
            slot_mapping=common.slot_mapping,
            seq_lens=self.seq_lens_dev,
            paged_kv_last_page_len=self.paged_kv_last_page_len[:rows],
        )

    def build_for_capture(self, common: CommonAttentionMetadata) -> AttnStepMetadata:
        return self.build(common)
