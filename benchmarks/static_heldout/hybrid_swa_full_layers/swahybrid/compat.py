"""FlashInfer names the backend checks at start-up, gathered in one place."""

INDICES_BUF_FIELD = "_paged_kv_indices_buf"
EXPECTED_LAYOUT = "NHD"
