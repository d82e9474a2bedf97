"""Priority page reservation: high-priority requests hold their KV pages up front and are never preempted."""

from prio.limits import PoolLimits, Priority, Watermarks

__all__ = ["PoolLimits", "Priority", "Watermarks"]
