"""Names that differ between the FlashInfer releases the team deploys."""

from __future__ import annotations

import flashinfer

# Where the wrapper keeps what plan() computed; logged when a plan looks wrong.
PLAN_STATE_ATTR = "_plan_info"


def flashinfer_version() -> str:
    return getattr(flashinfer, "__version__", "unknown")

