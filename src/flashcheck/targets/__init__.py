"""Targets: the code under test behind a small protocol (built-in FlashInfer targets, CPU reference, adapters)."""

from flashcheck.targets.protocol import Capacity, Target, TargetEnv, check_target

__all__ = ["Capacity", "Target", "TargetEnv", "check_target"]
