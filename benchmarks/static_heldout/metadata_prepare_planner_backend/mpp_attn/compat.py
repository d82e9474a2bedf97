"""Names of FlashInfer internals that the MLA path peeks at (kept in one place for upgrades)."""

PLAN_INFO_ATTR = "_plan_info"
