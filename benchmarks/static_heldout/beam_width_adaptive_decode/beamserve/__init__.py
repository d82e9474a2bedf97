"""Adaptive-width beam search serving: configuration, page pool and beam table."""

from .config import BEAM_GRAPH_WORKSPACE_BYTES, BeamConfig
from .pages import PagePool
from .beam_state import BeamRequest, BeamTable

__all__ = ["BEAM_GRAPH_WORKSPACE_BYTES", "BeamConfig", "PagePool", "BeamRequest", "BeamTable"]
