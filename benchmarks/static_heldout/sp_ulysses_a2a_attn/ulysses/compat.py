"""FlashInfer internals this project inspects, pinned to the version in pyproject.toml."""

FLASHINFER_PINNED = "0.2.8"
_INDPTR_ATTR = "_paged_kv_indptr_buf"
