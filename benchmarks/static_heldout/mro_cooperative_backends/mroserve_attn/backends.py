"""Concrete attention backends.

Each backend is a stack of mixins over ``FlashInferBackend``. The base order
is the order in which the per-step overrides run: a mixin's ``super()`` call
continues with the next class of the concrete backend's MRO.

    FlashInferGraphBackend: GraphBuffersMixin -> SlidingWindowMixin -> FlashInferBackend
    TrtllmGraphBackend:     TrtllmGenMixin -> GraphBuffersMixin -> FlashInferBackend
    CascadeGraphBackend:    CascadeMixin -> GraphBuffersMixin -> FlashInferBackend
    DraftGraphBackend:      SpecDecodeMixin -> SlidingWindowMixin -> GraphBuffersMixin -> FlashInferBackend
"""

from __future__ import annotations

from mroserve_attn.fi_backend import FlashInferBackend
from mroserve_attn.mixins.cascade import CascadeMixin
from mroserve_attn.mixins.graph_buffers import GraphBuffersMixin
from mroserve_attn.mixins.sliding_window import SlidingWindowMixin
from mroserve_attn.mixins.spec_decode import SpecDecodeMixin
from mroserve_attn.mixins.trtllm_gen import TrtllmGenMixin

__all__ = [
    "FlashInferBackend",
    "FlashInferGraphBackend",
    "TrtllmGraphBackend",
    "CascadeGraphBackend",
    "DraftGraphBackend",
]


class FlashInferGraphBackend(GraphBuffersMixin, SlidingWindowMixin, FlashInferBackend, register="flashinfer_graph"):
    """FA2 decode captured per bucket.

    Graph steps run every layer through the bucket's graph-mode wrappers (one
    per ``window_left``); eager steps fall through to the clipped window path.
    """

    def forward_extend(self, q, k, v, layer, fb):
        # The paged prefill wrappers already mask with window_left and the chunk
        # bound makes clipping pointless for prefill: go straight to them.
        return super(SlidingWindowMixin, self).forward_extend(q, k, v, layer, fb)


class TrtllmGraphBackend(TrtllmGenMixin, GraphBuffersMixin, FlashInferBackend, register="trtllm_graph"):
    """trtllm-gen decode: graph-mode wrappers on the trtllm-gen backend, the raw kernel eagerly."""


class CascadeGraphBackend(CascadeMixin, GraphBuffersMixin, FlashInferBackend, register="cascade_graph"):
    """Shared-system-prompt serving: two-level cascade decode over the pinned prompt pages."""

    # Prefill reads the prompt pages like any other prefix.
    forward_extend = FlashInferBackend.forward_extend


class DraftGraphBackend(SpecDecodeMixin, SlidingWindowMixin, GraphBuffersMixin, FlashInferBackend):
    """Backend of the draft model; built by ``SpecWorker``, not through the registry."""
