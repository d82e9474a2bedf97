from .config_service import DEFAULT_WS_BYTES, ConfigClient, WorkspacePlan, fallback_workspace_for
from .health import HealthChecker

__all__ = ["DEFAULT_WS_BYTES", "fallback_workspace_for", "ConfigClient", "WorkspacePlan", "HealthChecker"]
