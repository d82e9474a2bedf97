"""Encoder / prefill / decode disaggregation: shared configuration, protocol and transfer."""

from .config import EPDConfig
from .protocol import EmbeddingHandle, KVPageHandle, TransferTicket

__all__ = ["EPDConfig", "EmbeddingHandle", "KVPageHandle", "TransferTicket"]
