"""MoE all-to-all over NVSHMEM: configuration, capacity and the dispatcher."""
from .capacity import expert_capacity
from .config import MoEConfig
from .dispatch import A2ADispatcher

__all__ = ["A2ADispatcher", "MoEConfig", "expert_capacity"]
