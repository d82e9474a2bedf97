"""Live migration of running requests between the GPUs of one node."""

from gpumig.limits import DECODE_WS_BYTES, MigrationLimits

__all__ = ["DECODE_WS_BYTES", "MigrationLimits"]
