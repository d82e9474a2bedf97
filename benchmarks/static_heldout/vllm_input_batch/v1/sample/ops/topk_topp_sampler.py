"""FlashInfer top-k/top-p sampling, shaped like vLLM's topk_topp_sampler.py (flashinfer path)."""

import logging
from typing import Optional

import torch
import flashinfer.sampling

from v1.sample.metadata import SamplingMetadata

logger = logging.getLogger(__name__)


class TopKTopPSampler:
    def __init__(self, use_flashinfer: bool = True):
        self.use_flashinfer = use_flashinfer

    def forward_cuda(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        k, p = meta.top_k, meta.top_p
        if k is None and p is None:
            return logits.argmax(dim=-1)
        if (kmax := int(meta.top_k_cpu.max())) > logits.shape[-1]:  # ok: FC101
            raise ValueError(f"top_k {kmax} exceeds the vocabulary")
        if (k <= 0).any():  # expect: FC101
            k = torch.where(k <= 0, logits.shape[-1], k)
        logger.debug("sampling with top_k=%s", k)  # ok: FC101
        logger.info(f"sampling with top_p={p}")  # expect: FC101
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        return flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, k, p, deterministic=True)
