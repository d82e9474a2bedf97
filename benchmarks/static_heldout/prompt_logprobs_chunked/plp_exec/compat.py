"""Names that differ between FlashInfer releases, kept in one place."""

# rows the prefill planner reserved for the chunk (0.2.x name)
MAX_ROWS_ATTR = "_max_total_num_rows"
