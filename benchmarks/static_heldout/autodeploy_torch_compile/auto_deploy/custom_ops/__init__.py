"""Custom ops of the deploy path; importing this package registers them with torch.library."""

from auto_deploy.custom_ops.attention_interface import PlanParams, SequenceInfo
from auto_deploy.custom_ops.flashinfer_attention import flashinfer_mha_with_cache, get_planner

__all__ = ["PlanParams", "SequenceInfo", "flashinfer_mha_with_cache", "get_planner"]
