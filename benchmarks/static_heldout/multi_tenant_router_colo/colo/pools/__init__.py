"""Per-tenant resources: CUDA-graph pools and FlashInfer workspaces."""
from colo.pools.graph_pool import TenantGraphPool
from colo.pools.workspace import get_tenant_workspace

__all__ = ["TenantGraphPool", "get_tenant_workspace"]
