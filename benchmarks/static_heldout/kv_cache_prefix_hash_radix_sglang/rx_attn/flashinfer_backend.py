"""FlashInfer backend of the radix engine: decode indices are rebuilt from req_to_token every step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import fast_decode_plan

from radix import ForwardBatch, global_config
from rx_attn.kv_indices import create_flashinfer_kv_indices_triton

if TYPE_CHECKING:
    from rx_run.model import RadixAttention


@dataclass
class BackendDims:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    max_bs: int
    max_context_len: int
    sliding_window: int


def swa_workspace_bytes(dims: BackendDims) -> int:
    return dims.max_bs * dims.num_qo_heads * (dims.head_dim + 1) * 4 * 32 + (8 << 20)


@dataclass
class DecodeMetadata:
    decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper]


class IndicesUpdater:
    def __init__(self, backend: "FlashInferAttnBackend"):
        self.dims = backend.dims
        self.device = backend.device
        self.req_to_token = backend.req_to_token
        self.kv_indptr = backend.kv_indptr
        self.kv_last_page_len = backend.kv_last_page_len
        self.kv_last_page_len_cpu = backend.kv_last_page_len_cpu
        self.kv_indices = backend.eager_kv_indices

    def _heads(self) -> dict:
        d = self.dims
        return dict(num_qo_heads=d.num_qo_heads, num_kv_heads=d.num_kv_heads, head_dim=d.head_dim, page_size=1)

    def update_decode(self, fb: ForwardBatch, wrapper: BatchDecodeWithPagedKVCacheWrapper) -> None:
        bs = fb.batch_size
        kv_indptr = self.kv_indptr[: bs + 1]
        torch.cumsum(fb.seq_lens, dim=0, out=kv_indptr[1:])  # ok: FC104
        total = fb.seq_lens.sum().item()  # expect: FC101
        if self.kv_indices.numel() < total:
            self.kv_indices = torch.empty(2 * total, dtype=torch.int32, device=self.device)  # expect: FC107
        r2t = self.req_to_token
        create_flashinfer_kv_indices_triton[(bs,)](r2t, fb.req_pool_indices, fb.seq_lens, kv_indptr, self.kv_indices, r2t.shape[1])
        wrapper.plan(  # expect: FC102
            kv_indptr, self.kv_indices[:total], self.kv_last_page_len[:bs], **self._heads(), q_data_type=torch.bfloat16
        )

    def update_extend(self, fb: ForwardBatch, wrapper: BatchPrefillWithPagedKVCacheWrapper) -> None:
        bs = fb.batch_size
        total = fb.seq_lens_cpu.sum().item()  # ok: FC101
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr_cpu[1:] = torch.cumsum(fb.seq_lens_cpu, 0)
        kv_indptr_dev = kv_indptr_cpu.to(self.device, non_blocking=True)
        kv_indices = torch.empty(total, dtype=torch.int32, device=self.device)
        r2t = self.req_to_token
        create_flashinfer_kv_indices_triton[(bs,)](r2t, fb.req_pool_indices, fb.seq_lens, kv_indptr_dev, kv_indices, r2t.shape[1])
        d = self.dims
        wrapper.begin_forward(  # ok: FC102
            fb.qo_indptr_cpu, kv_indptr_cpu, kv_indices, self.kv_last_page_len_cpu[:bs],
            d.num_qo_heads, d.num_kv_heads, d.head_dim, 1, causal=True,
        )

    def plan_window(self, wrapper: BatchDecodeWithPagedKVCacheWrapper, indptr_cpu: torch.Tensor, indices, bs: int):
        wrapper.plan(
            indptr_cpu, indices, self.kv_last_page_len_cpu[:bs], **self._heads(),
            window_left=self.dims.sliding_window - 1, q_data_type=torch.bfloat16,
        )


class FlashInferAttnBackend:
    def __init__(self, dims: BackendDims, req_to_token: torch.Tensor, device: torch.device):
        self.dims = dims
        self.device = device
        self.req_to_token = req_to_token
        self.sliding_window = dims.sliding_window
        self._kv_layout = "NHD"
        self.workspace_buffer = torch.empty(global_config.flashinfer_workspace_size, dtype=torch.uint8, device=device)  # expect: FC106
        self.swa_workspace = torch.empty(swa_workspace_bytes(dims), dtype=torch.uint8, device=device)  # ok: FC105

        self.kv_indptr = torch.zeros(dims.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(dims.max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(dims.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(dims.max_bs, dtype=torch.int32, pin_memory=True)
        self.eager_kv_indices = torch.empty(dims.max_bs * 1024, dtype=torch.int32, device=device)
        self.max_mask_len = dims.max_bs * dims.max_context_len

        self.decode_wrappers = [BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, self._kv_layout)]
        self.prefill_wrapper_paged = BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, self._kv_layout)
        self.swa_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.swa_workspace, self._kv_layout)
        self.decode_cuda_graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.indices_updater = IndicesUpdater(self)
        self.forward_metadata: Optional[DecodeMetadata] = None
        self.custom_mask: Optional[torch.Tensor] = None
        self._plan_fn = fast_decode_plan

    @property
    def kv_layout(self) -> str:
        return self._kv_layout  # ok: FC103

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode == "decode":
            self.indices_updater.update_decode(fb, self.decode_wrappers[0])
            bs = fb.batch_size
            indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
            indptr_cpu[1:] = torch.cumsum(fb.seq_lens_cpu, 0)
            self.indices_updater.plan_window(self.swa_decode_wrapper, indptr_cpu, self.indices_updater.kv_indices, bs)
            self.forward_metadata = DecodeMetadata(self.decode_wrappers)
            return
        if self.custom_mask is None:
            self.custom_mask = torch.empty(self.max_mask_len, dtype=torch.uint8, device=self.device)  # ok: FC107
        self.indices_updater.update_extend(fb, self.prefill_wrapper_paged)
        self.forward_metadata = None

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros(max_bs * max_context_len, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor) -> None:
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace_buffer, self._kv_layout, use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(seq_lens_cpu, 0)
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices, self.kv_last_page_len_cpu[:bs],
            **self.indices_updater._heads(), q_data_type=torch.bfloat16,
        )
        self.indices_updater.plan_window(self.swa_decode_wrapper, self.kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices, bs)
        self.decode_cuda_graph_wrappers[bs] = wrapper
        self.forward_metadata = DecodeMetadata([wrapper])

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_mirror: torch.Tensor
    ) -> None:
        wrapper = self.decode_cuda_graph_wrappers[bs]
        self.raw_tokens = int(seq_lens_mirror[:raw_bs].sum())  # ok: FC101
        max_len = int(seq_lens.max())  # expect: FC101
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indptr[1:].copy_(torch.cumsum(seq_lens, dim=0))  # ok: FC104
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(seq_lens_mirror, 0)
        if max_len > self.sliding_window:
            swa_indptr_cpu = self.kv_indptr_cpu[: bs + 1]
            self.indices_updater.plan_window(self.swa_decode_wrapper, swa_indptr_cpu, self.cuda_graph_kv_indices, bs)
        self._plan_fn(  # expect: FC102
            wrapper, indptr=self.kv_indptr_cpu[: bs + 1], indices=self.cuda_graph_kv_indices,
            last_page_len=self.kv_last_page_len[:bs], **self.indices_updater._heads(), non_blocking=True,
        )
        create_flashinfer_kv_indices_triton[(bs,)](self.req_to_token, req_pool_indices, seq_lens, kv_indptr, self.cuda_graph_kv_indices, self.req_to_token.shape[1])  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer: "RadixAttention") -> torch.Tensor:
        if layer.sliding_window_size > 0:
            return self.swa_decode_wrapper.run(q, kv_cache)  # expect: FC108
        return self.forward_metadata.decode_wrappers[0].run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper_paged.run(q, kv_cache)

    def graph_memory_bytes(self) -> int:
        return sum(w._int_workspace_buffer.numel() for w in self.decode_cuda_graph_wrappers.values())  # expect: FC103
