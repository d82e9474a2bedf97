"""FlashInfer state: graph-mode decode wrappers per batch bucket, an eager verify wrapper for draft tokens."""
import itertools

import flashinfer
import numpy as np
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from pldserve.mem.token_pool import TokenKVPool

DECODE_WORKSPACE_BYTES = 128 * 1024 * 1024
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class PLDFlashInferState:
    def __init__(self, cfg, pool: TokenKVPool, device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.page_size = 1
        self.num_qo_heads, self.num_kv_heads, self.head_dim = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.max_bs = max(DECODE_BUCKETS)
        self.max_tokens = cfg.max_total_tokens
        self.use_trtllm = cfg.sm_version >= 100
        verify_ws = self._verify_workspace_bytes(cfg)
        self.decode_workspace = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.verify_workspace = torch.empty(verify_ws, dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(verify_ws, dtype=torch.uint8, device=device)
        self.trtllm_workspace = torch.empty(verify_ws, dtype=torch.uint8, device=device)  # expect: FC105

        # buffers the decode graphs read, sized for the largest bucket
        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(self.max_tokens, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.ones_gpu = torch.ones(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.req_to_token = torch.zeros((cfg.max_batch_size, cfg.max_seq_len), dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.qo_indptr_gpu = None

        self.decode_wrappers = {}
        self.verify_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.verify_workspace, "NHD", backend="fa2")
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.eager_decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self._plan_info = None

    @staticmethod
    def _verify_workspace_bytes(cfg) -> int:
        # split-k partial outputs for one verify step (every request: last token + drafts), fp32, plus int section
        tokens = cfg.max_batch_size * (cfg.num_draft_tokens + 1)
        return tokens * cfg.num_qo_heads * cfg.head_dim * 4 * 8 + (16 << 20)

    def init_graph_buffers(self):
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in DECODE_BUCKETS:
            self.decode_wrappers[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def last_plan(self):
        return self._plan_info  # ok: FC103

    def plan_decode_bucket(self, bs: int, padded_bs: int, slot_tables, seq_lens_cpu: np.ndarray):
        """Fill the bucket's graph buffers from the host slot tables, then plan (before every replay)."""
        indptr_np = self.kv_indptr_cpu.numpy()
        indptr_np[0] = 0
        np.cumsum(seq_lens_cpu[:bs], out=indptr_np[1 : bs + 1])
        indptr_np[bs + 1 : padded_bs + 1] = indptr_np[bs]
        total = int(indptr_np[bs])
        flat = np.concatenate([slot_tables[i][: seq_lens_cpu[i]] for i in range(bs)])
        self.kv_indices[:total].copy_(torch.from_numpy(flat), non_blocking=True)  # ok: FC104
        self.kv_indptr[: padded_bs + 1].copy_(self.kv_indptr_cpu[: padded_bs + 1], non_blocking=True)
        w = self.decode_wrappers[padded_bs]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: padded_bs + 1], self.kv_indices[:total], self.kv_last_page_len_cpu[:padded_bs],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size, data_type=self.cfg.dtype,
        )
        self._plan_info = ("decode", padded_bs)

    def plan_verify(self, bs: int, draft_lens_gpu: torch.Tensor, kv_indptr_cpu, kv_indices_gpu) -> int:
        """Eager verify: each request queries its last accepted token plus its draft tokens."""
        q_lens = draft_lens_gpu[:bs] + 1
        self.qo_indptr_gpu = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        torch.cumsum(q_lens, 0, dtype=torch.int32, out=self.qo_indptr_gpu[1:])
        max_q = int(q_lens.max())  # expect: FC101
        self.verify_wrapper.plan(  # expect: FC102
            self.qo_indptr_gpu, kv_indptr_cpu, kv_indices_gpu, self.kv_last_page_len_cpu[:bs],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size, causal=True,
        )
        self._plan_info = ("verify", bs)
        # kept to tell split-kv verify steps apart in the step trace
        self.last_verify_plan = list(self.verify_wrapper._plan_info)  # expect: FC103
        return max_q

    def plan_prefill(self, qo_lens: list[int], kv_lens: list[int], kv_indices_gpu):
        qo_indptr_host = torch.tensor([0, *itertools.accumulate(qo_lens)], dtype=torch.int32)
        kv_indptr_host = torch.tensor([0, *itertools.accumulate(kv_lens)], dtype=torch.int32)
        last_host = torch.ones(len(kv_lens), dtype=torch.int32)
        self.prefill_wrapper.plan(  # ok: FC102
            qo_indptr_host, kv_indptr_host, kv_indices_gpu, last_host,
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size, causal=True,
        )

    def plan_eager_decode(self, bs: int, seq_lens_cpu: np.ndarray, kv_indices_gpu):
        """Batches above the largest bucket run eagerly."""
        indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(torch.from_numpy(seq_lens_cpu[:bs]), 0, dtype=torch.int32, out=indptr_host[1:])
        self.eager_decode_wrapper.plan(  # expect: FC102
            indptr_host, kv_indices_gpu, self.ones_gpu[:bs],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size,
        )

    def forward_decode(self, q, layer_id: int, bs: int):
        kv = self.pool.kv_buffer[layer_id]
        if self.use_trtllm:
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.trtllm_workspace, self.req_to_token[:bs], self.seq_lens_gpu[:bs], self.cfg.max_seq_len
            )
        return self.decode_wrappers[bs].run(q, kv)  # ok: FC108

    def forward_verify(self, q, layer_id: int):
        return self.verify_wrapper.run(q, self.pool.kv_buffer[layer_id])  # expect: FC108

    def forward_eager(self, q, layer_id: int, prefill: bool):
        kv = self.pool.kv_buffer[layer_id]
        if prefill:
            return self.prefill_wrapper.run(q, kv)
        return self.eager_decode_wrapper.run(q, kv)
