from dagstep.batch import Request, StepBatch, StepContext, build_step_batch
from dagstep.config import PAGE_SIZE, PREFILL_WS_BYTES, EngineConfig

__all__ = ["EngineConfig", "PAGE_SIZE", "PREFILL_WS_BYTES", "Request", "StepBatch", "StepContext", "build_step_batch"]
