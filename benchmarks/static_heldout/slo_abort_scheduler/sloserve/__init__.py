"""sloserve: continuous batching that schedules by deadline and priority.

Requests carry a time-to-first-token deadline and a per-token latency target. Decode rows are persistent: a request
keeps its row from admission to completion, so a request aborted by its client (or preempted) leaves a hole that
stays in the batch, padded, until the next compaction moves live rows down.
"""

__version__ = "0.4.2"
