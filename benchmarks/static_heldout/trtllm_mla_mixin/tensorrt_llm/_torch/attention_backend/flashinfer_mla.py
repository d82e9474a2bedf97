from dataclasses import dataclass, field

import torch
from flashinfer import BatchMLAPagedAttentionWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from .interface import AttentionMetadata, CudaGraphBufferMixin
from .workspace import alloc_trtllm_workspace, alloc_zeroed_workspace, get_mla_workspace


@dataclass(kw_only=True)
class FlashInferMLAMetadata(CudaGraphBufferMixin, AttentionMetadata):
    use_trtllm_gen: bool = False
    _mla_wrapper: BatchMLAPagedAttentionWrapper = field(init=False, default=None)

    def __post_init__(self):
        dev = torch.device("cuda")
        n = self.max_num_requests
        self._kv_layout = "NHD"  # ok: FC103
        self.qo_indptr_buf = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.kv_indptr_buf = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=dev)
        self.kv_lens_buf = torch.zeros(n, dtype=torch.int32, device=dev)
        self.kv_lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.block_ids_buf = None
        self.workspace = get_mla_workspace(dev.index or 0)
        self.trtllm_workspace = alloc_trtllm_workspace(self.max_num_tokens * 576 * 4, dev)
        self.xqa_workspace = alloc_zeroed_workspace(self.max_num_tokens * 576 * 4, dev)
        self._mla_wrapper = BatchMLAPagedAttentionWrapper(
            self.workspace, use_cuda_graph=True, qo_indptr=self.qo_indptr_buf, kv_indptr=self.kv_indptr_buf,
            kv_indices=self.kv_indices_buf, kv_len_arr=self.kv_lens_buf, backend="fa3",
        )
        backend = "trtllm-gen" if self.use_trtllm_gen else "fa2"
        self._context_wrapper = BatchPrefillWithRaggedKVCacheWrapper(torch.empty(self.max_num_tokens * 8192, dtype=torch.uint8, device=dev), "NHD", backend=backend)  # expect: FC105

    def prepare(self, num_contexts: int):
        assert num_contexts <= self.max_num_requests, "too many context requests"  # expect: FC109
        bs = self.seq_lens_cpu.shape[0]
        self.kv_lens_cpu[:bs].copy_(self.seq_lens_cpu)
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(self.kv_lens_cpu[:bs], 0)
        total = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.kv_lens_buf[:bs].copy_(self.kv_lens_cpu[:bs], non_blocking=True)  # ok: FC104
        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        longest = self.kv_lens_buf[:bs].max().item()  # expect: FC101
        longest_cpu = self.kv_lens_cpu[:bs].max().item()  # ok: FC101
        self.kv_indices_buf = (  # expect: FC107
            torch.empty(total, dtype=torch.int32, device="cuda") if total > self.kv_indices_buf.numel() else self.kv_indices_buf
        )
        self.block_ids_buf = (  # ok: FC107
            torch.zeros(self.max_num_tokens, dtype=torch.int32, device="cuda") if self.block_ids_buf is None else self.block_ids_buf
        )

        def _plan(kv_len_arr):
            self._mla_wrapper.plan(  # expect: FC102
                self.qo_indptr_buf[: bs + 1], self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, kv_len_arr,
                128, 512, 64, 1, True, 0.1, torch.bfloat16, torch.bfloat16,
            )

        if self.is_cuda_graph:
            _plan(self.kv_lens_buf[:bs])
        else:
            self._mla_wrapper.plan(  # ok: FC102
                torch.arange(bs + 1, dtype=torch.int32), self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf,
                self.kv_lens_cpu[:bs], 128, 512, 64, 1, True, 0.1, torch.bfloat16, torch.bfloat16,
            )
        self.kv_indices_buf[total:].fill_(0)  # expect: FC104
        return longest, longest_cpu

    def run_decode(self, q_nope, q_pe, ckv, kpe):
        return self._mla_wrapper.run(q_nope, q_pe, ckv, kpe)  # ok: FC108

    def run_trtllm_decode(self, query, kv_cache, block_tables, seq_lens, max_seq_len):
        out = trtllm_batch_decode_with_kv_cache_mla(query, kv_cache, self.trtllm_workspace, 128, 512, 64, block_tables, seq_lens, max_seq_len)
        out2 = trtllm_batch_decode_with_kv_cache_mla(query, kv_cache, self.xqa_workspace, 128, 512, 64, block_tables, seq_lens, max_seq_len)
        return out, out2

    def run_context(self, q, k, v):
        return self._context_wrapper.run(q, k, v)  # expect: FC108
