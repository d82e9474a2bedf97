"""rmserve: batch scoring for reward models that share a GPU with the policy being trained."""

from rmserve.settings import RewardSettings

__all__ = ["RewardSettings"]
