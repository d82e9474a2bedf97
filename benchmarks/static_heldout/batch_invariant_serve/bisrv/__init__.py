"""bisrv: batch-invariant serving.

A request's tokens must not depend on which other requests share its batch, on the batch size the scheduler picked,
or on whether a token was computed in prefill or decode. The engine therefore fixes the KV split size of every
attention kernel (``fixed_split_size``), uses one reduction order for norms and log-softmax, and samples with a
per-request Philox stream keyed by ``(seed, step)`` instead of a global generator.
"""

__version__ = "0.4.1"
