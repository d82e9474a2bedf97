"""Sampling stage: penalties from device token histories, grammar bitmasks, top-k/top-p on the device."""
from sampling.grammar import GrammarBitmaskStager, apply_bitmask
from sampling.history import TokenHistory
from sampling.params import SamplingBatch, SamplingParams
from sampling.sampler import EagerSampler, GraphSampler

__all__ = [
    "GrammarBitmaskStager",
    "apply_bitmask",
    "TokenHistory",
    "SamplingBatch",
    "SamplingParams",
    "EagerSampler",
    "GraphSampler",
]
