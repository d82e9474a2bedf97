"""gemmaserve: serving Gemma-2/3 style models (local/global attention, logit soft-capping) on FlashInfer."""

from gemmaserve.common import StepBatch, GemmaConfig, LayerType, PlanParams

__all__ = ["StepBatch", "GemmaConfig", "LayerType", "PlanParams"]
