"""FlashInfer attention for the POD server.

Mixed steps (one prefill chunk + the running decodes) run through ``PODWithPagedKVCacheWrapper``: the
prefill request's query attends to its gathered prefix KV while the decode rows read the paged cache, both in
one launch. Pure-decode steps replay a CUDA graph per batch-size bucket over graph-mode decode wrappers;
batches above the largest bucket fall back to an eager decode wrapper.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, PODWithPagedKVCacheWrapper

from podserve.config import DECODE_GRAPH_WORKSPACE_BYTES, PodConfig
from podserve.scheduler import StepPlan

logger = logging.getLogger(__name__)


@dataclass
class DecodeMetadata:
    bs: int
    padded_bs: int
    use_graph: bool
    slot_mapping: torch.Tensor


@dataclass
class MixedMetadata:
    chunk_len: int
    num_decodes: int
    prefill_kv_len: int
    kv_indptr_gpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    decode_seq_lens: torch.Tensor
    prefill_page_ids: torch.Tensor
    slot_mapping: torch.Tensor
    sample_indices: torch.Tensor
    num_tokens_gpu: torch.Tensor
    wrapper: PODWithPagedKVCacheWrapper

    @property
    def max_decode_len(self) -> int:
        return int(self.decode_seq_lens.max())  # expect: FC101


class PodAttnBackend:
    def __init__(self, cfg: PodConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch_size

        self.workspace_buffer = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.graph_workspace = torch.zeros(DECODE_GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.mixed_graph_workspace = torch.zeros(cfg.graph_workspace_bytes(max_bs), dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"

        # pinned host mirrors handed to plan(), device buffers the captured graphs read
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(cfg.max_num_pages, dtype=torch.int32, pin_memory=True)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)

        self.mixed_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.mixed_kv_indices = torch.zeros(cfg.max_num_pages, dtype=torch.int32, device=device)
        self.mixed_kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.mixed_positions = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.sample_scratch: Optional[torch.Tensor] = None

        self.pod_wrapper = PODWithPagedKVCacheWrapper(self.workspace_buffer, cfg.kv_layout)
        self.eager_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, cfg.kv_layout, backend=self.decode_backend)
        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.pod_graph_wrappers: Dict[Tuple[int, int], PODWithPagedKVCacheWrapper] = {}
        self._plan_info: Dict[str, Tuple[int, int]] = {}  # ok: FC103
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr.zero_()

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.graph_buckets:
            self.graph_decode_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.cfg.kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        for chunk, bs in self.cfg.mixed_graph_shapes:
            # one POD wrapper per captured (chunk, decode batch) shape, on its own persistent buffers
            self.pod_graph_wrappers[(chunk, bs)] = PODWithPagedKVCacheWrapper(
                self.mixed_graph_workspace,
                self.cfg.kv_layout,
                paged_kv_indptr_buffer=self.mixed_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.mixed_kv_indices,
                paged_kv_last_page_len_buffer=self.mixed_kv_last_page_len[:bs],
            )

    def workspace_report(self) -> Dict[str, int]:
        report = {"decode_graphs": self.graph_workspace.numel(), "mixed_graphs": self.mixed_graph_workspace.numel()}
        report["pod"] = self.pod_wrapper._float_workspace_buffer.numel()  # expect: FC103
        return report

    def _decode_slots(self, plan: StepPlan) -> np.ndarray:
        ps = self.cfg.page_size
        last_pages = plan.decode_kv_indices_np[plan.decode_kv_indptr_np[1:] - 1].astype(np.int64)
        return last_pages * ps + plan.decode_last_page_len_np - 1

    def _prefill_slots(self, plan: StepPlan) -> np.ndarray:
        ps = self.cfg.page_size
        pages = np.asarray(plan.prefill.pages, dtype=np.int64)
        pos = np.arange(plan.chunk_start, plan.chunk_start + plan.chunk_len)
        return pages[pos // ps] * ps + pos % ps

    def _head_kwargs(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)

    def warm_decode_plan(self, bs: int) -> DecodeMetadata:
        """Plans a bucket's graph wrapper with one page per row, before that bucket is captured."""
        self.kv_indptr_cpu[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.kv_last_page_len_cpu[:bs].fill_(1)
        wrapper = self.graph_decode_wrappers[bs]
        c = self.cfg
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_cpu[:bs],
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, q_data_type=c.dtype,
        )
        return DecodeMetadata(bs=bs, padded_bs=bs, use_graph=True, slot_mapping=self.slot_mapping[:bs])

    def prepare_decode_replay(self, bs: int, padded_bs: int, plan: StepPlan) -> DecodeMetadata:
        assert padded_bs in self.graph_decode_wrappers, f"no decode graph for batch {padded_bs}"  # expect: FC109
        n_pages = len(plan.decode_kv_indices_np)
        self.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(plan.decode_kv_indptr_np))
        # padded rows are empty sequences that start after the last real page
        self.kv_indptr_cpu[bs + 1 : padded_bs + 1] = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.kv_last_page_len_cpu[:bs].copy_(torch.from_numpy(plan.decode_last_page_len_np))
        self.kv_indices_cpu[:n_pages].copy_(torch.from_numpy(plan.decode_kv_indices_np))
        self.kv_indices[:n_pages].copy_(self.kv_indices_cpu[:n_pages], non_blocking=True)  # ok: FC104
        self.slot_mapping[:bs].copy_(torch.from_numpy(self._decode_slots(plan)), non_blocking=True)
        wrapper = self.graph_decode_wrappers[padded_bs]
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: padded_bs + 1],
            self.kv_indices[:n_pages],
            self.kv_last_page_len_cpu[:padded_bs],
            **self._head_kwargs(),
            q_data_type=self.cfg.dtype,
        )
        self.kv_last_page_len[bs:padded_bs].fill_(1)  # expect: FC104
        self._plan_info["decode"] = (padded_bs, n_pages)
        return DecodeMetadata(bs=bs, padded_bs=padded_bs, use_graph=True, slot_mapping=self.slot_mapping[:padded_bs])

    def plan_eager_decode(self, plan: StepPlan) -> DecodeMetadata:
        """Batches above the largest bucket: one eager plan, no graph."""
        bs = plan.num_decodes
        seq_lens = torch.from_numpy(plan.decode_seq_lens_np).to(self.device, non_blocking=True)
        kv_last_page_len = (seq_lens - 1) % self.cfg.page_size + 1
        self.slot_mapping[:bs].copy_(torch.from_numpy(self._decode_slots(plan)), non_blocking=True)
        self.eager_decode_wrapper.plan(  # expect: FC102
            torch.from_numpy(plan.decode_kv_indptr_np),
            torch.from_numpy(plan.decode_kv_indices_np).to(self.device, non_blocking=True),
            kv_last_page_len,
            **self._head_kwargs(),
            q_data_type=self.cfg.dtype,
        )
        self._plan_info["decode"] = (bs, len(plan.decode_kv_indices_np))
        return DecodeMetadata(bs=bs, padded_bs=bs, use_graph=False, slot_mapping=self.slot_mapping[:bs])

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        wrapper = self.graph_decode_wrappers.get(meta.padded_bs) if meta.use_graph else None
        if wrapper is None:
            wrapper = self.eager_decode_wrapper
        return wrapper.run(q, kv_cache)  # ok: FC108

    def prepare_mixed(self, plan: StepPlan, graph_shape: Optional[Tuple[int, int]] = None) -> MixedMetadata:
        bs = plan.num_decodes
        n_pages = len(plan.decode_kv_indices_np)
        wrapper = self.pod_graph_wrappers[graph_shape] if graph_shape is not None else self.pod_wrapper

        kv_indptr_gpu = torch.from_numpy(plan.decode_kv_indptr_np).to(self.device, non_blocking=True)
        kv_last_page_len_cpu = torch.from_numpy(plan.decode_last_page_len_np)
        self.mixed_kv_indices[:n_pages].copy_(torch.from_numpy(plan.decode_kv_indices_np), non_blocking=True)
        slots = np.concatenate([self._prefill_slots(plan), self._decode_slots(plan)])
        self.slot_mapping[: len(slots)].copy_(torch.from_numpy(slots), non_blocking=True)

        prefill_pos = torch.arange(plan.chunk_start, plan.chunk_start + plan.chunk_len, device=self.device)
        decode_pos = torch.from_numpy(plan.decode_seq_lens_np - 1).to(self.device, non_blocking=True)
        self.mixed_positions = torch.cat([prefill_pos, decode_pos.long()])  # expect: FC107

        # logits rows: the chunk's last token if it finishes the prompt, then every decode row
        finishes_prompt = plan.chunk_start + plan.chunk_len == len(plan.prefill.prompt_ids)
        rows = np.arange(plan.chunk_len - 1 if finishes_prompt else plan.chunk_len, plan.num_tokens)
        if self.sample_scratch is None:
            self.sample_scratch = torch.empty(self.cfg.max_num_tokens, dtype=torch.int64, device=self.device)  # ok: FC107
        self.sample_scratch[: len(rows)].copy_(torch.from_numpy(rows), non_blocking=True)

        wrapper.plan(  # expect: FC102
            indptr=kv_indptr_gpu,
            indices=self.mixed_kv_indices[:n_pages],
            last_page_len=kv_last_page_len_cpu,
            **self._head_kwargs(),
            q_data_type=self.cfg.dtype,
        )
        self._plan_info["mixed"] = (plan.chunk_len, bs)
        logger.debug("mixed step planned: chunk=%d kv_indptr=%s", plan.chunk_len, kv_indptr_gpu)  # ok: FC101
        pages = torch.from_numpy(np.asarray(plan.prefill.pages, dtype=np.int64))
        return MixedMetadata(
            chunk_len=plan.chunk_len,
            num_decodes=bs,
            prefill_kv_len=plan.chunk_start + plan.chunk_len,
            kv_indptr_gpu=kv_indptr_gpu,
            kv_last_page_len_cpu=kv_last_page_len_cpu,
            decode_seq_lens=torch.from_numpy(plan.decode_seq_lens_np).to(self.device, non_blocking=True),
            prefill_page_ids=pages.to(self.device, non_blocking=True),
            slot_mapping=self.slot_mapping[: len(slots)],
            sample_indices=self.sample_scratch[: len(rows)],
            num_tokens_gpu=torch.full((1,), plan.num_tokens, dtype=torch.int64, device=self.device),
            wrapper=wrapper,
        )

    def gather_prefix_kv(self, kv_cache: torch.Tensor, meta: MixedMetadata) -> Tuple[torch.Tensor, torch.Tensor]:
        # kv_cache: [num_pages, 2, page_size, num_kv_heads, head_dim] (NHD)
        pages = kv_cache.index_select(0, meta.prefill_page_ids)
        k = pages[:, 0].flatten(0, 1)[: meta.prefill_kv_len]
        v = pages[:, 1].flatten(0, 1)[: meta.prefill_kv_len]
        return k, v

    def forward_mixed(self, q_p: torch.Tensor, q_d: torch.Tensor, kv_cache: torch.Tensor, meta: MixedMetadata):
        k_p, v_p = self.gather_prefix_kv(kv_cache, meta)
        out_p, out_d = meta.wrapper.run(q_p, k_p, v_p, q_d, kv_cache, causal_p=True)  # expect: FC108
        return out_p, out_d

    def store_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        flat = kv_cache.transpose(0, 1).flatten(1, 2)  # [2, num_pages * page_size, heads, dim]
        flat[0].index_copy_(0, slot_mapping, k)
        flat[1].index_copy_(0, slot_mapping, v)
