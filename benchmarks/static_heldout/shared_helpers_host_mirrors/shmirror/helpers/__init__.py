"""Helpers shared by the per-step metadata, the model's forward and the offline tools.

Every helper takes numpy arrays, host tensors or device tensors and answers in kind; the
caller decides where the work happens by what it hands in.
"""

from shmirror.helpers.clamp import check_lens, clamp_lens, clamp_lens_
from shmirror.helpers.indptr import cumsum_indptr, indptr_from_counts_into, segment_starts
from shmirror.helpers.pages import last_page_lens, max_pages, pages_per_seq, total_pages

__all__ = [
    "check_lens",
    "clamp_lens",
    "clamp_lens_",
    "cumsum_indptr",
    "indptr_from_counts_into",
    "last_page_lens",
    "max_pages",
    "pages_per_seq",
    "segment_starts",
    "total_pages",
]
