from dataclasses import dataclass

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, merge_state

from vidserve.config import VideoEngineConfig


@dataclass
class DecodeBatch:
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor  # pinned
    kv_indices: torch.Tensor  # device page ids
    last_page_len_cpu: torch.Tensor  # pinned
    mem_indptr_cpu: torch.Tensor  # pinned: compressed video-memory tokens per request
    rope_deltas_cpu: torch.Tensor
    input_ids: torch.Tensor


class VideoAttnBackend:
    def __init__(self, cfg: VideoEngineConfig, device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch
        self.decode_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.prefill_workspace = torch.zeros(cfg.max_num_tokens * cfg.num_heads * 64, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.memory_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.eager_decode = self._make_eager_decode()
        self.graph_wrappers = {}

    def _make_eager_decode(self):
        ws = torch.empty(self.cfg.max_batch * self.cfg.num_heads * 1 << 16, dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()
        return BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend=self.decode_backend)

    def init_graph_wrappers(self):
        cfg = self.cfg
        self.decode_workspace = torch.empty(cfg.max_batch * cfg.num_heads * 1 << 16, dtype=torch.uint8, device=self.device)  # expect: FC105
        for bs in cfg.decode_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace, "NHD", use_cuda_graph=True, backend=self.decode_backend,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def prepare_prefill(self, qo_indptr, kv_indptr_cpu, kv_indices, last_page_len_cpu, mem_indptr_cpu):
        cfg = self.cfg
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr, kv_indptr_cpu, kv_indices, last_page_len_cpu,
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, causal=True,
        )
        self.memory_wrapper.plan(mem_indptr_cpu, mem_indptr_cpu, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, causal=False)

    def decode(self, bs, q, kv_cache, mem_k, mem_v):
        w = self.graph_wrappers[bs]
        o, lse = w.run_return_lse(q, kv_cache)  # ok: FC108
        # attend to the request's compressed long-video memory as well and merge the two softmax states
        o_mem, lse_mem = self.memory_wrapper.run_return_lse(q, mem_k, mem_v)  # expect: FC108
        return merge_state(o, lse, o_mem, lse_mem)[0]
