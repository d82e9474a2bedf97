# FlashInfer wrapper state the dispatcher looks at
GRAPH_FLAG_ATTR = "_use_cuda_graph"
