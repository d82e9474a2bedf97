"""Names of FlashInfer internals that the debug endpoints print."""

PLAN_INFO_ATTR = "_plan_info"
