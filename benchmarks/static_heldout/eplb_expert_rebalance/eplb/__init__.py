"""Expert-parallel load balancing: placement, load recording on the device, periodic rebalancing."""

from eplb.kernels import remap_topk_ids
from eplb.placement import ExpertPlacement, create_balance_plan
from eplb.recorder import ExpertLoadRecorder

__all__ = ["ExpertLoadRecorder", "ExpertPlacement", "create_balance_plan", "remap_topk_ids"]
