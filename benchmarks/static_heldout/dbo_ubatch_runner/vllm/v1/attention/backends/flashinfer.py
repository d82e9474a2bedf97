"""FlashInfer attention (v1). With dual-batch overlap each micro-batch has its own builder, so its own
wrappers, persistent buffers and workspace: the two ubatches' kernels overlap on different streams."""
from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import fast_decode_plan, trtllm_batch_decode_with_kv_cache

from vllm.v1.attention.backends.utils import CommonAttentionMetadata, split_decodes_and_prefills

FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024
# the private field the two ubatches share when their decode shapes match (see GPUModelRunner._share_plans)
PLAN_INFO_ATTR = "_plan_info"

_WORKSPACES: Optional[List[torch.Tensor]] = None


def get_ubatch_workspaces(num_ubatches: int, device: torch.device) -> List[torch.Tensor]:
    global _WORKSPACES
    if _WORKSPACES is None:
        _WORKSPACES = [torch.zeros(FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=device) for _ in range(num_ubatches)]  # expect: FC106
    return _WORKSPACES


@functools.lru_cache(maxsize=None)
def _trtllm_gen_workspace(ubatch_id: int, nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def _gather_block_table(block_table: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, num_reqs: int, num_pages: int) -> None:
    """Flatten the used prefix of every block-table row into `indices`."""
    pages_per_req = indptr[1 : num_reqs + 1] - indptr[:num_reqs]
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    mask = cols[None, :] < pages_per_req[:, None]
    indices[:num_pages] = block_table[:num_reqs][mask]  # expect: FC101


@dataclass
class FlashInferMetadata:
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    padded_decodes: int
    paged_kv_indptr: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    max_seq_len: int
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    use_trtllm_decode: bool = False
    workspace_buffer: Optional[torch.Tensor] = None


class FlashInferMetadataBuilder:
    reorder_batch_threshold: ClassVar[int] = 1

    def __init__(self, vllm_config, device: torch.device, ubatch_id: int = 0):
        cfg = vllm_config
        self.device = device
        self.ubatch_id = ubatch_id
        self.page_size = cfg.block_size
        self.num_qo_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_size
        self.max_num_reqs = cfg.max_num_seqs
        self.enable_cuda_graph = cfg.full_cuda_graph
        self.cudagraph_batch_sizes = sorted(cfg.cudagraph_capture_sizes)
        self.use_trtllm_decode = cfg.attention_backend == "FLASHINFER_TRTLLM"
        self._workspace_buffer = get_ubatch_workspaces(cfg.num_ubatches, device)[ubatch_id]
        if self.use_trtllm_decode:
            nbytes = self.max_num_reqs * self.num_qo_heads * (self.head_dim + 2) * 4 * 16
            self._trtllm_workspace = _trtllm_gen_workspace(ubatch_id, nbytes, device.index)

        max_pages = self.max_num_reqs * cfg.max_blocks_per_req
        self.paged_kv_indptr = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.paged_kv_last_page_len = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indptr_np = self.paged_kv_indptr_cpu.numpy()
        self.paged_kv_last_page_len_np = self.paged_kv_last_page_len_cpu.numpy()

        self._decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self._graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def _pad_for_cudagraph(self, n: int) -> int:
        return self.cudagraph_batch_sizes[bisect.bisect_left(self.cudagraph_batch_sizes, n)]

    def _get_prefill_wrapper(self) -> BatchPrefillWithPagedKVCacheWrapper:
        if self._prefill_wrapper is None:
            self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self._workspace_buffer, "HND")
        return self._prefill_wrapper

    def _get_decode_wrapper(self, batch_size: int, use_cudagraph: bool) -> BatchDecodeWithPagedKVCacheWrapper:
        if not use_cudagraph:
            if self._decode_wrapper is None:
                self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self._workspace_buffer, "HND", use_tensor_cores=True)
            return self._decode_wrapper
        wrapper = self._graph_decode_wrappers.get(batch_size)
        if wrapper is None:
            self.paged_kv_last_page_len[:batch_size].fill_(self.page_size)  # ok: FC104
            wrapper = BatchDecodeWithPagedKVCacheWrapper(
                self._workspace_buffer,
                "HND",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                paged_kv_indices_buffer=self.paged_kv_indices,
                paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
            )
            self._graph_decode_wrappers[batch_size] = wrapper
        return wrapper

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False) -> FlashInferMetadata:
        cm = common_attn_metadata
        num_reqs = cm.num_reqs
        page_size = self.page_size
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(cm, self.reorder_batch_threshold)

        seq_lens_np = cm.seq_lens_cpu.numpy()
        indptr_np = self.paged_kv_indptr_np
        last_np = self.paged_kv_last_page_len_np
        indptr_np[0] = 0
        np.cumsum((seq_lens_np + page_size - 1) // page_size, out=indptr_np[1 : num_reqs + 1])
        last_np[:num_reqs] = np.where(seq_lens_np % page_size == 0, page_size, seq_lens_np % page_size)
        num_actual_pages = int(self.paged_kv_indptr_cpu[num_reqs])  # ok: FC101
        if num_actual_pages > self.paged_kv_indices.numel():
            self.paged_kv_indices = torch.empty(2 * num_actual_pages, dtype=torch.int32, device=self.device)  # expect: FC107

        use_cudagraph = self.enable_cuda_graph and num_prefills == 0 and num_decodes <= self.cudagraph_batch_sizes[-1]
        pad_bs = self._pad_for_cudagraph(num_decodes) if use_cudagraph else num_decodes
        if pad_bs > num_decodes:
            # padded rows of the bucket: one dummy page each
            indptr_np[num_decodes + 1 : pad_bs + 1] = num_actual_pages + np.arange(1, pad_bs - num_decodes + 1)
            last_np[num_decodes:pad_bs] = 1
        # a first-time bucket binds its graph wrapper here, before the device arrays are filled
        decode_wrapper = None
        if num_decodes > 0 and not self.use_trtllm_decode:
            decode_wrapper = self._get_decode_wrapper(pad_bs, use_cudagraph)
        n = max(num_reqs, pad_bs)
        self.paged_kv_indptr[: n + 1].copy_(self.paged_kv_indptr_cpu[: n + 1], non_blocking=True)  # ok: FC104
        self.paged_kv_last_page_len[:n].copy_(self.paged_kv_last_page_len_cpu[:n], non_blocking=True)
        _gather_block_table(cm.block_table_tensor, self.paged_kv_indptr, self.paged_kv_indices, num_reqs, num_actual_pages)

        md = FlashInferMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            padded_decodes=pad_bs,
            paged_kv_indptr=self.paged_kv_indptr[: pad_bs + 1],
            paged_kv_last_page_len=self.paged_kv_last_page_len[:pad_bs],
            seq_lens=cm.seq_lens,
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            max_seq_len=cm.max_seq_len,
        )
        if num_prefills > 0:
            prefill_wrapper = self._get_prefill_wrapper()
            qo_indptr = cm.query_start_loc[num_decodes:] - cm.query_start_loc[num_decodes]
            first_page = int(self.paged_kv_indptr_cpu[num_decodes])
            prefill_wrapper.plan(  # expect: FC102
                qo_indptr,
                self.paged_kv_indptr_cpu[num_decodes : num_reqs + 1] - first_page,
                self.paged_kv_indices[first_page:num_actual_pages],
                self.paged_kv_last_page_len_cpu[num_decodes:num_reqs],
                self.num_qo_heads,
                self.num_kv_heads,
                self.head_dim,
                page_size,
                causal=True,
            )
            md.prefill_wrapper = prefill_wrapper
        if num_decodes > 0 and self.use_trtllm_decode:
            md.use_trtllm_decode = True
            md.workspace_buffer = self._trtllm_workspace
        elif decode_wrapper is not None:
            if use_cudagraph:
                fast_decode_plan(  # expect: FC102
                    decode_wrapper,
                    indptr=self.paged_kv_indptr[: pad_bs + 1],
                    indices=self.paged_kv_indices,
                    last_page_len=self.paged_kv_last_page_len_cpu[:pad_bs],
                    num_qo_heads=self.num_qo_heads,
                    num_kv_heads=self.num_kv_heads,
                    head_dim=self.head_dim,
                    page_size=page_size,
                    non_blocking=True,
                )
            else:
                decode_wrapper.plan(  # ok: FC102
                    self.paged_kv_indptr_cpu[: num_decodes + 1],
                    self.paged_kv_indices,
                    self.paged_kv_last_page_len_cpu[:num_decodes],
                    self.num_qo_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    page_size,
                    non_blocking=True,
                )
            # never hand a zero-length last page to the kernel
            self.paged_kv_last_page_len[:pad_bs].clamp_(min=1)  # expect: FC104
            md.decode_wrapper = decode_wrapper
        return md

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> FlashInferMetadata:
        md = self.build(0, common_attn_metadata)
        wrapper = md.decode_wrapper
        if wrapper is not None and wrapper._fixed_batch_size != md.padded_decodes:  # expect: FC103
            raise RuntimeError(f"decode graph wrapper does not match the {md.padded_decodes}-row bucket")
        return md


class FlashInferImpl:
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int):
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads

    def forward(self, layer, query, key, value, kv_cache, attn_metadata: FlashInferMetadata, output: Optional[torch.Tensor] = None):
        n = attn_metadata.num_actual_tokens
        nd = attn_metadata.num_decode_tokens
        if output is None:
            output = torch.empty_like(query)
        k_scale = layer._k_scale_float  # ok: FC103
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            key[:n], value[:n], kv_cache[:, 0], kv_cache[:, 1], attn_metadata.slot_mapping, "auto", layer._k_scale, layer._v_scale
        )
        if attn_metadata.prefill_wrapper is not None:
            attn_metadata.prefill_wrapper.run(query[nd:n], kv_cache, k_scale=k_scale, out=output[nd:n])  # expect: FC108
        if attn_metadata.use_trtllm_decode:
            trtllm_batch_decode_with_kv_cache(
                query=query[:nd],
                kv_cache=kv_cache,
                workspace_buffer=attn_metadata.workspace_buffer,
                block_tables=attn_metadata.block_table[: attn_metadata.num_decodes],
                seq_lens=attn_metadata.seq_lens[: attn_metadata.num_decodes],
                max_seq_len=attn_metadata.max_seq_len,
                bmm1_scale=self.scale * k_scale,
                bmm2_scale=1.0,
                out=output[:nd],
            )
        elif attn_metadata.decode_wrapper is not None:
            attn_metadata.decode_wrapper.run(query[:nd], kv_cache, k_scale=k_scale, out=output[:nd])  # ok: FC108
        return output
