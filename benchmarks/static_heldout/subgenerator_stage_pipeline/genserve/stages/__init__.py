"""The sub-generators a step delegates to with ``yield from``."""

from .forward import ModelStage
from .metadata import MetadataStage
from .planning import PlanStage
from .schedule import ScheduleStage

__all__ = ["MetadataStage", "ModelStage", "PlanStage", "ScheduleStage"]
