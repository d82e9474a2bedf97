"""Omni serving: audio and vision encoders feed a thinker LM whose hidden states drive a talker speech LM."""

from omni.config import ComponentConfig, EncoderConfig, OmniConfig
from omni.stream import HiddenStream

__all__ = ["ComponentConfig", "EncoderConfig", "HiddenStream", "OmniConfig"]
