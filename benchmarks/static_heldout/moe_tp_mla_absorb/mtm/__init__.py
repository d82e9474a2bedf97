"""DeepSeek-style MLA + MoE serving: absorbed MLA weights, a sparse top-k indexer, expert parallelism."""
