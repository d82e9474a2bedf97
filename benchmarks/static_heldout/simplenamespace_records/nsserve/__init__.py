"""nsserve: a small paged-KV serving engine whose per-step state lives in loose records."""

from nsserve.records import apply_fields, as_kwargs, copy_record, make_meta, make_record, update_record

__all__ = ["apply_fields", "as_kwargs", "copy_record", "make_meta", "make_record", "update_record"]
__version__ = "0.3.0"
