"""Per-request sampling inside the captured decode graph."""

from fsample.config import SamplingEngineConfig, WsTier
from fsample.params import RequestSampling, SamplingParams, SamplingParamsStager, StagedParams
from fsample.rows import expand_rows, seeded_uniform
from fsample.sampler import GraphSampler

__all__ = [
    "SamplingEngineConfig",
    "WsTier",
    "RequestSampling",
    "SamplingParams",
    "SamplingParamsStager",
    "StagedParams",
    "GraphSampler",
    "expand_rows",
    "seeded_uniform",
]
