"""Layerwise KV offload to host memory for a vLLM v1-style engine."""

from lmc_connector.config import ConnectorConfig, EngineLimits

__all__ = ["ConnectorConfig", "EngineLimits"]
