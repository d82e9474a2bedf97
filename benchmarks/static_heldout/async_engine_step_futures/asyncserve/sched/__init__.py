from asyncserve.sched.meta_builder import HostMetaBuilder
from asyncserve.sched.scheduler import AsyncScheduler

__all__ = ["AsyncScheduler", "HostMetaBuilder"]
