"""Per-step prefill metadata handed to the prefill wrapper."""

from dataclasses import dataclass

import torch

from ntkserve.batch import StepBatch


@dataclass
class PrefillMeta:
    qo_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    positions: torch.Tensor


def build_prefill_meta(batch: StepBatch, device) -> PrefillMeta:
    qo = torch.from_numpy(batch.qo_indptr_np)
    # the rope kernel reads qo_indptr on the device to find each token's request
    return PrefillMeta(
        qo_indptr=qo.to(device, non_blocking=True),
        kv_indptr_cpu=torch.from_numpy(batch.kv_indptr_np),
        kv_indices=torch.from_numpy(batch.kv_indices_np).to(device, non_blocking=True),
        last_page_len_cpu=torch.from_numpy(batch.last_page_len_np),
        positions=batch.positions_dev,
    )
