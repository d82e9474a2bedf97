from .buffer import AcceptedTokenBuffer
from .config import DistillConfig
from .trainer import DraftTrainer

__all__ = ["AcceptedTokenBuffer", "DistillConfig", "DraftTrainer"]
