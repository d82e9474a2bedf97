"""A flight recorder for engine steps: inputs, plan state, outputs, checksums."""

from steplog.checksum import Checksummer, fold_checksum
from steplog.record import StepRecord, StepRecorder

__all__ = ["Checksummer", "StepRecord", "StepRecorder", "fold_checksum"]
