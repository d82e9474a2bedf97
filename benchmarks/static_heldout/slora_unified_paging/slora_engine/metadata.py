"""Per-step metadata: SGMV segments for the LoRA delta beside the attention plan."""

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import torch

from slora.adapters import AdapterRegistry
from slora.config import SLoRAConfig
from slora.kernels.sgmv import build_segments, token_slots

if TYPE_CHECKING:
    from slora_engine.attention import UnifiedPagedAttention

logger = logging.getLogger(__name__)


@dataclass
class StepBatch:
    bs: int
    input_ids: torch.Tensor
    adapter_ids: List[str]
    adapter_slots_host: torch.Tensor  # pinned int64 [bs]: slot index of each row
    n_pages_np: np.ndarray
    last_len_np: np.ndarray
    page_ids_np: np.ndarray
    persona_indptr_np: np.ndarray
    persona_indices_np: np.ndarray
    persona_last_np: np.ndarray
    splice_count: int = 0
    splice_pos_dev: Optional[torch.Tensor] = None
    splice_pages_dev: Optional[torch.Tensor] = None


@dataclass
class LoRAStepMeta:
    seg_indptr: torch.Tensor
    weight_indices: torch.Tensor
    num_segments: int
    row_slot: Optional[torch.Tensor] = None
    rank_offsets: Optional[torch.Tensor] = None
    shrink_rows: int = 0


@dataclass
class AttnPrefillMeta:
    qo_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor


class StepMetadataBuilder:
    def __init__(self, cfg: SLoRAConfig, attn: "UnifiedPagedAttention", registry: AdapterRegistry, device: torch.device):
        self.cfg = cfg
        self.attn = attn
        self.registry = registry
        self.device = device
        n = cfg.max_batch
        self.seg_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.seg_indptr_dev = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.seg_lens_dev = torch.zeros(n, dtype=torch.int32, device=self.device)
        self.weight_idx_dev = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.rank_staging = torch.empty(n, dtype=torch.int32, pin_memory=True)
        self.seg_hist = [0] * 9

    def _segment_stats(self, n_seg: int, verbose: bool) -> None:
        self.seg_hist[min(n_seg, len(self.seg_hist) - 1)] += 1
        if verbose:
            logger.info("segments this step: %s", self.seg_lens_dev[:n_seg].tolist())  # ok: FC101

    def _segments(self, slots_host: torch.Tensor) -> LoRAStepMeta:
        seg_indptr_np, weight_idx_np = build_segments(slots_host.numpy())
        n_seg = int(weight_idx_np.shape[0])
        self.seg_indptr_host[: n_seg + 1] = torch.from_numpy(seg_indptr_np)
        rows = int(self.seg_indptr_host[n_seg])  # ok: FC101
        self.seg_indptr_dev[: n_seg + 1].copy_(self.seg_indptr_host[: n_seg + 1], non_blocking=True)
        self.weight_idx_dev[:n_seg].copy_(torch.from_numpy(weight_idx_np), non_blocking=True)
        torch.sub(self.seg_indptr_dev[1 : n_seg + 1], self.seg_indptr_dev[:n_seg], out=self.seg_lens_dev[:n_seg])
        shrink_rows = sum(self.seg_lens_dev[:n_seg])  # expect: FC101

        meta = LoRAStepMeta(
            seg_indptr=self.seg_indptr_dev[: n_seg + 1],
            weight_indices=self.weight_idx_dev[:n_seg],
            num_segments=n_seg,
            shrink_rows=shrink_rows,
        )
        meta.row_slot = token_slots(meta.weight_indices, self.seg_lens_dev[:n_seg], rows)
        meta.rank_offsets = torch.zeros(n_seg + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        torch.cumsum(self.registry.slot_rank_gpu[meta.weight_indices], 0, dtype=torch.int32, out=meta.rank_offsets[1:])
        if n_seg > self.rank_staging.numel():
            self.rank_staging = torch.empty(n_seg, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self._segment_stats(n_seg, verbose=False)
        return meta

    def build_prefill(self, row_slots_host: torch.Tensor) -> LoRAStepMeta:
        return self._segments(row_slots_host)

    def build(self, batch: StepBatch) -> LoRAStepMeta:
        meta = self._segments(batch.adapter_slots_host[: batch.bs])
        self.attn.plan_decode(batch)
        if batch.splice_count:
            # prefix-tuned adapters: their virtual-token pages go in front of each row's own pages
            self.attn.kv_indices_buf.index_copy_(0, batch.splice_pos_dev, batch.splice_pages_dev)  # expect: FC104
        return meta
