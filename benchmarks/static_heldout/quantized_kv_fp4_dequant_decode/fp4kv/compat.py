"""FlashInfer internals the engine's memory report looks at."""

FLOAT_WS_ATTR = "_float_workspace_buffer"
