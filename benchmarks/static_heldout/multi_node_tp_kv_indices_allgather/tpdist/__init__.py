"""Multi-node tensor parallelism: rank 0 schedules, every rank attends."""
from tpdist.comm import MetadataBroadcaster, StepMeta
from tpdist.config import TPConfig
from tpdist.schedule import Rank0Scheduler, Sequence, StepPlan

__all__ = ["MetadataBroadcaster", "StepMeta", "TPConfig", "Rank0Scheduler", "Sequence", "StepPlan"]
