"""Multi-tenant serving with per-tenant KV page quotas and cross-tenant prefix sharing."""

__all__ = ["ServerConfig", "TenantServer"]

from tqp.config import ServerConfig
from tqp.server import TenantServer
