from .batch import TreeBatch
from .config import SpecConfig
from .sizes import MAX_TREE_NODES, WsSize
from .tree import TokenTree, batch_tree_mask, build_tree, tree_position_ids

__all__ = [
    "MAX_TREE_NODES",
    "SpecConfig",
    "TokenTree",
    "TreeBatch",
    "WsSize",
    "batch_tree_mask",
    "build_tree",
    "tree_position_ids",
]
