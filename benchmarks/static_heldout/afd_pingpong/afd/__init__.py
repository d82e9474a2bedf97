"""afd: attention-FFN disaggregation.

Attention ranks hold the KV cache and run attention; FFN ranks hold the experts. Every decode step is split into
micro-batches that ping-pong: while micro-batch i's hidden states are with the FFN ranks, micro-batch i+1 runs its
attention. Tokens travel between the two sides through an M2N all-to-all on a dedicated stream.
"""

__version__ = "0.2.0"
