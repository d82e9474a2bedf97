"""FlashInfer backend: FA2 paged prefill after cache hits, decode graphs per bucket,
a cascade for decodes that share a cached system prompt, trtllm-gen past the buckets."""
from __future__ import annotations

from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import MultiLevelCascadeAttentionWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from pcache import DECODE_WORKSPACE_BYTES, PrefixCacheConfig
from pc_attn.block_table import BlockTable
from pc_attn.metadata import PrefixStepMeta
from pc_attn.workspace import fa2_workspace


class PrefixCacheBackend:
    def __init__(self, cfg: PrefixCacheConfig, block_table: BlockTable, device: torch.device) -> None:
        self.cfg, self.device, self.block_table = cfg, device, block_table
        self.sm_scale = cfg.head_dim**-0.5
        self.graph_workspace = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = fa2_workspace(cfg.prefill_workspace_bytes, device)
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.shared_prefix_wrapper = MultiLevelCascadeAttentionWrapper(2, self.prefill_workspace, "NHD")
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_meta: Optional[PrefixStepMeta] = None
        # what each bucket was planned for, kept by the engine (not FlashInfer's)
        self._plan_info: Dict[int, tuple] = {}  # ok: FC103
        self.init_cuda_graph_state()

    def init_cuda_graph_state(self) -> None:
        max_bs = self.cfg.max_graph_bs
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(max_bs * self.cfg.max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self.last_len_buf = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.last_len_buf.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def _head_args(self):
        return self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.block_size

    def init_forward_metadata(self, meta: PrefixStepMeta) -> None:
        self.forward_meta = meta
        if meta.num_prefill_tokens > 0:
            self.prefill_wrapper.plan(  # expect: FC102
                meta.qo_indptr, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_cpu,
                *self._head_args(), causal=True, sm_scale=self.sm_scale, q_data_type=torch.bfloat16,
            )
        if meta.shared_prefix_blocks > 0:
            self._plan_shared_prefix(meta)

    def _plan_shared_prefix(self, meta: PrefixStepMeta) -> None:
        n, shared = meta.num_reqs, meta.shared_prefix_blocks
        shared_qo_cpu = torch.tensor([0, n], dtype=torch.int32)
        shared_kv_cpu = torch.tensor([0, shared], dtype=torch.int32)
        shared_last_cpu = torch.tensor([self.cfg.block_size], dtype=torch.int32)
        suffix_kv_cpu = meta.kv_indptr_cpu - torch.arange(n + 1, dtype=torch.int32) * shared
        self.shared_prefix_wrapper.plan(  # ok: FC102
            [shared_qo_cpu, meta.qo_indptr_cpu], [shared_kv_cpu, suffix_kv_cpu],
            [meta.kv_indices[:shared], meta.kv_indices[shared:]], [shared_last_cpu, meta.last_page_len_cpu],
            *self._head_args(), sm_scale=self.sm_scale,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens: torch.Tensor) -> PrefixStepMeta:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.last_len_buf[:bs],
        )
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf[:bs], self.last_len_cpu[:bs],
            *self._head_args(), q_data_type=torch.bfloat16,
        )
        self.decode_wrappers[bs] = w
        self._plan_info[bs] = (bs, bs)
        meta = PrefixStepMeta(
            bs, bs, 0, torch.arange(bs + 1, dtype=torch.int32, device=self.device), self.kv_indptr_cpu[: bs + 1],
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf[:bs], self.last_len_cpu[:bs], self.last_len_buf[:bs],
            torch.ones(bs, dtype=torch.int32), seq_lens[:bs], self.block_table.block_ids, self.cfg.block_size,
            self.cfg.system_prompt_blocks,
        )
        if meta.shared_prefix_blocks > 0:
            self._plan_shared_prefix(meta)
        self.forward_meta = meta
        return meta

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: PrefixStepMeta) -> None:
        self.forward_meta = meta
        n = meta.num_reqs
        pages = int(meta.kv_indptr_cpu[n])
        longest = int(meta.seq_lens_cpu[:n].max())  # ok: FC101
        if longest > self.cfg.max_model_len:
            raise ValueError(f"sequence of {longest} tokens exceeds max_model_len={self.cfg.max_model_len}")
        self.kv_indices_buf[:pages].copy_(meta.kv_indices[:pages], non_blocking=True)  # ok: FC104
        self.kv_indptr_cpu[: n + 1] = meta.kv_indptr_cpu[: n + 1]
        self.kv_indptr_cpu[n + 1 : bs + 1] = pages
        self._plan_bucket(self.decode_wrappers[bs], bs)
        # padding rows attend to one token of the null block
        self.last_len_buf[n:bs].fill_(1)  # expect: FC104
        self._plan_info[bs] = (n, pages)

    def _plan_bucket(self, w: BatchDecodeWithPagedKVCacheWrapper, bs: int) -> None:
        meta = self.forward_meta
        w.plan(  # expect: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, meta.last_page_len[:bs],
            *self._head_args(), q_data_type=torch.bfloat16,
        )

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        meta = self.forward_meta
        if meta.shared_prefix_blocks > 0:
            return self.shared_prefix_wrapper.run(q, kv_cache)  # expect: FC108
        if meta.num_decodes > self.cfg.max_graph_bs:
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_workspace, meta.block_tables, meta.seq_lens, meta.max_seq_len,
                bmm1_scale=self.sm_scale, bmm2_scale=1.0,
            )
        bs = self.cfg.bucket_for(meta.num_decodes)
        return self.decode_wrappers[bs].run(q, kv_cache)  # ok: FC108
