"""Paged attention over the unified pool, and the LoRA delta beside it.

Decode runs through graph-mode wrappers per bucket; requests whose adapter carries a persona prompt
(pages cached once per adapter) also attend to those pages through an eager wrapper and merge by LSE.
"""

import functools
from typing import Dict

import flashinfer
import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, SegmentGEMMWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from slora.config import SLoRAConfig
from slora.kernels.sgmv import bgmv_delta, lora_shrink_expand
from slora.pool import UnifiedPagePool
from slora.workspaces import long_ctx_workspace, zeroed_decode_workspace
from slora_engine.metadata import AttnPrefillMeta, LoRAStepMeta, StepBatch


class TracedPrefillWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """Paged prefill that reports which kernel backend served each adapter batch."""

    def backend_name(self) -> str:
        return str(self._backend)  # expect: FC103


def make_persona_attn(w):
    def attend(q: torch.Tensor, kv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        o_p, lse_p = w.run_return_lse(q, kv)  # expect: FC108
        merged, _ = flashinfer.merge_state(o, lse, o_p, lse_p)
        return merged

    return attend


class UnifiedPagedAttention:
    def __init__(self, cfg: SLoRAConfig, pool: UnifiedPagePool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        max_bs = cfg.max_batch
        max_idx = max_bs * cfg.max_pages_per_seq

        self.graph_workspace = torch.empty(cfg.attn_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.prefill_workspace = torch.zeros(cfg.PREFILL_WS_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.sgmv_workspace = torch.zeros(cfg.sgmv_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.long_workspace = zeroed_decode_workspace(cfg, self.device)
        self.decode_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"

        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(max_idx, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_idx, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:bs],
                backend="fa2",
            )
            for bs in cfg.buckets
        }
        self.overflow_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            long_ctx_workspace(cfg, self.device), "NHD", backend=self.decode_backend
        )
        self.persona_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, "NHD", backend="fa2")
        self.prefill_wrapper = TracedPrefillWrapper(self.prefill_workspace, "NHD", backend="fa2")

        self._prefill_plan = self.prefill_wrapper.plan
        self._persona_plan = functools.partial(
            self.persona_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        self._persona_attend = make_persona_attn(self.persona_wrapper)
        # prompt-side SGMV; the shrink shares the prefill planner's float scratch (never concurrent)
        self.sgmv_shrink = SegmentGEMMWrapper(self.prefill_wrapper._float_workspace_buffer)  # expect: FC103
        self.sgmv_expand = SegmentGEMMWrapper(self.sgmv_workspace)

    def _head_kwargs(self):
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- metadata ----------------------------------------------------------------------------------
    def ready_bucket(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indices_host[:bs] = 0
        self.kv_last_page_len_host[:bs] = 1
        self.graph_wrappers[bs].plan(
            self.kv_indptr_host[: bs + 1], self.kv_indices_host[:bs], self.kv_last_page_len_host[:bs], **self._head_kwargs()
        )
        empty = torch.zeros(bs + 1, dtype=torch.int32)
        self._persona_plan(empty, torch.zeros(1, dtype=torch.int32), torch.ones(bs, dtype=torch.int32))

    def plan_decode(self, batch: StepBatch) -> None:
        bs = batch.bs
        n = batch.n_pages_np.shape[0]
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(batch.n_pages_np, out=indptr_np[1 : n + 1])
        indptr_np[n + 1 :] = indptr_np[n]
        total = int(indptr_np[-1])
        self.kv_indptr_host[: bs + 1] = torch.from_numpy(indptr_np)
        self.kv_indices_host[:total] = torch.from_numpy(batch.page_ids_np)
        self.kv_last_page_len_host[:n] = torch.from_numpy(batch.last_len_np)
        self.kv_last_page_len_host[n:bs] = 1

        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:total].copy_(self.kv_indices_host[:total], non_blocking=True)
        self.kv_last_page_len_buf[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_host[:total],
            self.kv_last_page_len_host[:bs],
            **self._head_kwargs(),
        )
        self._persona_plan(  # ok: FC102
            torch.from_numpy(batch.persona_indptr_np),
            torch.from_numpy(batch.persona_indices_np),
            torch.from_numpy(batch.persona_last_np),
        )

    def plan_prefill(self, meta: AttnPrefillMeta) -> None:
        c = self.cfg
        self._prefill_plan(  # expect: FC102
            qo_indptr=meta.qo_indptr,
            paged_kv_indptr=meta.kv_indptr_host,
            paged_kv_indices=meta.kv_indices,
            paged_kv_last_page_len=meta.last_page_len_host,
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim_qk=c.head_dim,
            page_size=c.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def scrub_pages(self, victims: torch.Tensor, victims_np: np.ndarray) -> None:
        """KV pages handed to an adapter: no page list may still name them."""
        hit = torch.isin(self.kv_indices_buf, victims.int())
        self.kv_indices_buf.masked_fill_(hit, 0)  # expect: FC104
        host_hit = torch.from_numpy(np.isin(self.kv_indices_host.numpy(), victims_np))
        self.kv_indices_host.masked_fill_(host_hit, 0)  # ok: FC104

    # ---- kernels --------------------------------------------------------------------------------------
    def lora_delta_decode(self, h: torch.Tensor, a_stack, b_stack, meta: LoRAStepMeta) -> torch.Tensor:
        return bgmv_delta(h, a_stack, b_stack, meta.row_slot, self.cfg.lora_scale)

    def lora_delta_prefill(self, h: torch.Tensor, a_stack, b_stack, meta: LoRAStepMeta) -> torch.Tensor:
        return lora_shrink_expand(
            self.sgmv_shrink,
            self.sgmv_expand,
            h,
            a_stack,
            b_stack,
            meta.seg_indptr,
            meta.weight_indices,
            meta.num_segments,
            self.cfg.lora_scale,
        )

    def forward_decode(self, q: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        kv = self.pool.kv_layer(layer)
        o, lse = self.graph_wrappers[bs].run(q, kv, return_lse=True)
        return self._persona_attend(q, kv, o, lse)

    def forward_prefill(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.prefill_wrapper.run(q, self.pool.kv_layer(layer))  # ok: FC108

    def forward_long(self, q, layer: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int):
        return trtllm_batch_decode_with_kv_cache(
            q,
            self.pool.kv_layer(layer),
            self.long_workspace,
            block_tables,
            seq_lens,
            max_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
        )

    def plan_overflow(self, indptr_host: torch.Tensor, indices: torch.Tensor, last_host: torch.Tensor) -> None:
        self.overflow_wrapper.plan(indptr_host, indices, last_host, **self._head_kwargs())

    def forward_overflow(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        return self.overflow_wrapper.run(q, self.pool.kv_layer(layer))
