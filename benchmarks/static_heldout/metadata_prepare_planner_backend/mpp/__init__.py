from .config import DUMMY_PAGE, GRAPH_BUCKETS, BackendConfig
from .inputs import ForwardInput, PrefillInput
from .kernels import last_page_lens, pages_needed

__all__ = [
    "DUMMY_PAGE",
    "GRAPH_BUCKETS",
    "BackendConfig",
    "ForwardInput",
    "PrefillInput",
    "last_page_lens",
    "pages_needed",
]
