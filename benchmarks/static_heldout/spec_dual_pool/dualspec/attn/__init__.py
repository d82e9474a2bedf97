from .state import DraftAttnState, ModelAttnState, TargetAttnState

__all__ = ["DraftAttnState", "ModelAttnState", "TargetAttnState"]
