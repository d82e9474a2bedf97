"""Runtime rescaling of tensor parallelism (TP=2 <-> TP=4)."""
