"""Background integrity checking of the paged KV cache."""
from .checksum import ChecksumRecords, fold_pages, page_checksums
from .config import IntegrityConfig
from .quarantine import PageTable, QuarantineSet
from .scanner import IntegrityScanner

__all__ = [
    "ChecksumRecords",
    "fold_pages",
    "page_checksums",
    "IntegrityConfig",
    "PageTable",
    "QuarantineSet",
    "IntegrityScanner",
]
