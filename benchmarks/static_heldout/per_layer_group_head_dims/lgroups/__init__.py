"""Layer groups with their own head dim, page size and KV pool.

Local (sliding-window) layers use head_dim 128 on 16-token pages; global layers use
head_dim 256 on 32-token pages. Each group has a KV pool, a wrapper set and step
metadata of its own, and every group is planned each step.
"""
from lgroups.kv_pool import GroupKVPool
from lgroups.page_table import GroupPageTable, build_group_page_table, token_rows
from lgroups.spec import LayerGroupSpec, ModelGroupsConfig
from lgroups.workspace import graph_workspace

__all__ = [
    "GroupKVPool",
    "GroupPageTable",
    "build_group_page_table",
    "token_rows",
    "LayerGroupSpec",
    "ModelGroupsConfig",
    "graph_workspace",
]
