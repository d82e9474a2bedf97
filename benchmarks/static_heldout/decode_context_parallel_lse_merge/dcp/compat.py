"""FlashInfer version shims."""
from __future__ import annotations

_GRAPH_FLAG = "_use_cuda_graph"


def is_graph_wrapper(wrapper) -> bool:
    """True when ``wrapper`` was built for CUDA graphs (its buffers are fixed)."""
    return bool(getattr(wrapper, _GRAPH_FLAG, False))  # expect: FC103
