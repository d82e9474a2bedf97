"""FlashInfer metadata builder, shaped like vLLM v1 backends/flashinfer.py (trtllm decode switch)."""

from dataclasses import dataclass
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper

FLASHINFER_WORKSPACE_BUFFER_SIZE = 256 * 1024 * 1024


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_reqs: int


class FlashInferMetadataBuilder:
    def __init__(self, vllm_config, device: torch.device, use_trtllm: bool):
        self.device = device
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.page_size = vllm_config.cache_config.block_size
        workspace = torch.empty(FLASHINFER_WORKSPACE_BUFFER_SIZE, dtype=torch.uint8, device=device)  # expect: FC105, FC106
        self._decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", backend="trtllm-gen" if use_trtllm else "fa2"
        )
        self.paged_kv_indptr_gpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.paged_kv_indptr_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.paged_kv_last_page_len_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.paged_kv_indices = torch.zeros(self.max_num_reqs * 1024, dtype=torch.int32, device=device)
        self._graph_decode_wrapper = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            workspace, self.paged_kv_indptr_gpu, self.paged_kv_indices, self.paged_kv_last_page_len_cpu.to(device), "NHD"
        )

    def build(self, common: CommonAttentionMetadata, for_graph: bool = False):
        n = common.num_reqs
        self.paged_kv_indptr_cpu[1 : n + 1] = torch.cumsum(common.seq_lens_cpu // self.page_size + 1, 0)
        w = self._graph_decode_wrapper if for_graph else self._decode_wrapper
        if not hasattr(self._decode_wrapper, "_cached_module"):  # expect: FC103
            self._warm = True
        w.plan(self.paged_kv_indptr_cpu[: n + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:n], 32, 8, 128, self.page_size)  # ok: FC102
        self._decode_wrapper.plan(self.paged_kv_indptr_gpu[: n + 1], self.paged_kv_indices, self.paged_kv_last_page_len_cpu[:n], 32, 8, 128, self.page_size)  # expect: FC102
        self.paged_kv_indptr_gpu[: n + 1].copy_(self.paged_kv_indptr_cpu[: n + 1], non_blocking=True)  # expect: FC104
        return w

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata):
        return self.build(common, for_graph=True)

    def run_decode(self, wrapper, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return wrapper.run(q, kv_cache)  # ok: FC108

    def run_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self._decode_wrapper.run(q, kv_cache)  # expect: FC108
