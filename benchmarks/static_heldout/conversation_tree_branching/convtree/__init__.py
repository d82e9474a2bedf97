from .compat import FI_GRAPH_FLAG
from .config import ChatServerConfig, WsTier
from .pages import PagePool
from .tree import BranchNode, ConversationTree, branch_offsets

__all__ = ["FI_GRAPH_FLAG", "ChatServerConfig", "WsTier", "PagePool", "BranchNode", "ConversationTree", "branch_offsets"]
