"""Per-expert load accounting, export to a monitor thread, and expert placement."""
from .config import MoEConfig
from .constants import EXPORT_EVERY, PAGE_SIZE
from .monitor import LoadMonitor, propose_placement
from .placement import ExpertPlacement
from .recorder import ExpertLoadRecorder

__all__ = ["EXPORT_EVERY", "PAGE_SIZE", "ExpertLoadRecorder", "ExpertPlacement", "LoadMonitor", "MoEConfig", "propose_placement"]
