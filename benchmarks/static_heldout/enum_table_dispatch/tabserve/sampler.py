"""Sampling, with the kernels picked by the batch's ``SamplingFlag`` set."""

from __future__ import annotations

import torch
from flashinfer.sampling import top_p_sampling_from_probs

from tabserve.batch import SamplingInfo
from tabserve.config import EngineConfig
from tabserve.modes import SamplingFlag


class Sampler:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg

    def __call__(self, logits: torch.Tensor, info: SamplingInfo) -> torch.Tensor:
        if info.all_greedy:
            return torch.argmax(logits, dim=-1)
        temps = info.temperatures.clamp_min(1e-5)
        probs = torch.softmax(logits.float() / temps[:, None], dim=-1)
        if SamplingFlag.TOP_P in info.flags:
            ids = top_p_sampling_from_probs(probs, info.top_p)
        else:
            ids = torch.multinomial(probs, 1).squeeze(1)
        if SamplingFlag.MIXED_GREEDY in info.flags:
            greedy_rows = torch.nonzero(info.temperatures == 0).squeeze(1)  # expect: FC101
            ids[greedy_rows] = torch.argmax(logits[greedy_rows], dim=-1)
        return ids
