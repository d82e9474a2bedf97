"""trtllm-gen plugin (Blackwell), loaded by module name; its kernels pick split counts per launch: eager only."""
from __future__ import annotations

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from peab.batch import StepBatch
from peab.config import EngineConfig
from peab_plugins.base import AttentionBackend, KVCache

BACKEND_CLASS = "TrtllmGenBackend"


def make_workspace(nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    if zeroed:
        buf.zero_()
    return buf


class TrtllmGenBackend(AttentionBackend):
    supports_cuda_graph = False
    SCRATCH_BYTES = 32 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, layer_type: str, device: torch.device):
        super().__init__(cfg, layer_type, device)
        self.workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.kv_layout, backend="trtllm-gen")
        # head dims the trtllm-gen cubins do not cover fall back to FA2
        self.use_fa2_fallback = cfg.head_dim not in (64, 128)
        self.fa2_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.kv_layout, backend="fa2")
        prefill_bytes = cfg.max_num_tokens * cfg.num_qo_heads * cfg.head_dim * 4
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(make_workspace(prefill_bytes, device), self.kv_layout, backend="trtllm-gen")
        self.scratch = torch.zeros(self.SCRATCH_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.block_tables = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.seq_lens_i32 = None
        self.seq_lens_host = torch.zeros(cfg.max_batch_size, dtype=torch.int32, pin_memory=True)
        self.cu_kv_cpu = torch.zeros(cfg.max_batch_size + 1, dtype=torch.int32)
        self.max_kv_len = self.max_q_len = 0
        self.fresh_prompts = False

    def init_forward_metadata(self, batch: StepBatch) -> None:
        cfg, bs = self.cfg, batch.batch_size
        self.max_kv_len = batch.seq_lens.max().item()  # expect: FC101
        self.seq_lens_host[:bs].copy_(batch.seq_lens)  # expect: FC101
        if self.seq_lens_i32 is None:
            self.seq_lens_i32 = torch.empty(cfg.max_batch_size, dtype=torch.int32, device=self.device)  # ok: FC107
        pages_cpu = batch.kv_indptr_cpu[1:] - batch.kv_indptr_cpu[:-1]
        rows_cpu = torch.repeat_interleave(torch.arange(bs), pages_cpu)  # ok: FC101
        cols_cpu = torch.arange(rows_cpu.numel()) - batch.kv_indptr_cpu[rows_cpu]
        self.block_tables = torch.zeros(bs, cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)  # expect: FC107
        self.block_tables[rows_cpu.to(self.device), cols_cpu.to(self.device)] = batch.kv_indices
        if batch.is_decode:
            decode = self.fa2_decode if self.use_fa2_fallback else self.decode_wrapper
            decode.plan(  # expect: FC102
                **dict(
                    indptr=batch.kv_indptr_cpu, indices=batch.kv_indices, last_page_len=batch.kv_last_page_len,
                    num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                    page_size=cfg.page_size)
            )
        else:
            q_lens_cpu = batch.qo_indptr_cpu[1:] - batch.qo_indptr_cpu[:-1]
            self.max_q_len = int(q_lens_cpu.max())  # ok: FC101
            self.fresh_prompts = torch.equal(q_lens_cpu, batch.seq_lens_cpu)
            self.cu_kv_cpu = torch.cat([self.cu_kv_cpu[:1], torch.cumsum(batch.seq_lens_cpu, 0, dtype=torch.int32)])  # ok: FC107
            self.prefill_wrapper.plan(  # ok: FC102
                batch.qo_indptr_cpu, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.dims,
                causal=True)
            self.qo_indptr_gpu = batch.qo_indptr
        self.seq_lens_i32[:bs].copy_(batch.seq_lens)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        # nothing to bind: the wrappers keep what the last eager step planned
        self.max_kv_len = 0

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        self.init_forward_metadata(batch)

    def forward_decode(self, q: torch.Tensor, kv_cache: KVCache, layer_id: int) -> torch.Tensor:
        if self.use_fa2_fallback:
            return self.fa2_decode.run(q, kv_cache)  # expect: FC108
        return self.decode_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_extend(self, q, k, v, kv_cache: KVCache, layer_id: int) -> torch.Tensor:
        if self.fresh_prompts:
            bs = self.block_tables.shape[0]
            return trtllm_batch_context_with_kv_cache(
                q, kv_cache, self.scratch, self.block_tables, self.seq_lens_i32[:bs],
                max_q_len=self.max_q_len, max_kv_len=self.max_kv_len,
                bmm1_scale=self._sm_scale, bmm2_scale=1.0, batch_size=bs,
                cum_seq_lens_q=self.qo_indptr_gpu, cum_seq_lens_kv=self.cu_kv_cpu.to(self.device))
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108

    def kernel_info(self) -> str:
        return f"trtllm-gen decode {getattr(self.decode_wrapper, '_cached_module', None)!r}"  # expect: FC103
