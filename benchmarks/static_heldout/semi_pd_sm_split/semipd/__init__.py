"""semipd: semi-disaggregated serving.

Prefill and decode run in one process on two SM partitions of the same GPU (green contexts where the driver has
them, prioritized streams otherwise). They share one KV pool: the prefill worker writes a prompt's pages and hands
the page ids to the decode worker, whose decode steps replay CUDA graphs captured on the decode partition's stream.
A controller moves SMs between the partitions when the prefill latency drifts from its target.
"""

__version__ = "0.1.3"
