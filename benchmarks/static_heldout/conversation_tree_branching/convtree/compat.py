"""Names of FlashInfer internals this server has needed at one time or another."""

# FlashInfer 0.2.x keeps the graph-mode flag here; set to capture a wrapper built in eager mode.
FI_GRAPH_FLAG = "_use_cuda_graph"
