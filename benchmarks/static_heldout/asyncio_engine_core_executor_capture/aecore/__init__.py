"""aecore: the host side of the asyncio engine core (config, requests, scheduling)."""
from aecore.config import PAGE_SIZE, PREFILL_WORKSPACE_BYTES, EngineConfig
from aecore.request import ModelOutput, Request, StepBatch

__all__ = ["PAGE_SIZE", "PREFILL_WORKSPACE_BYTES", "EngineConfig", "ModelOutput", "Request", "StepBatch"]
