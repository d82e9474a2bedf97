from .tree import DynamicTree, build_dynamic_tree
from .drafter import Eagle2Config, Eagle2Drafter
from .verify_backend import TreeVerifyBackend
from .verify_graphs import VerifyGraphRunner
