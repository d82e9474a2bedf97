"""hotkv: InfLLM-style long-context serving.

Every page of KV lives in pinned host memory. Per step, each request attends to
its sink pages, its most relevant context blocks (chosen by representative keys)
and its local window; those pages are kept in a GPU hot cache of fixed slots and
paged in on a miss.
"""
