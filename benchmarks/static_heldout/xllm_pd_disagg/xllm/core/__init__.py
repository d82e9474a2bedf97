from xllm.core.config import EngineConfig, InstanceRole, WorkspaceMiB

__all__ = ["EngineConfig", "InstanceRole", "WorkspaceMiB"]
