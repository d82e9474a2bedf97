import torch


class GraphMemoryPool:
    """The memory pool every bucket's graph allocates from; a re-tune opens a fresh generation."""

    def __init__(self):
        self.handle = torch.cuda.graph_pool_handle()
        self.generation = 0

    def renew(self) -> None:
        self.handle = torch.cuda.graph_pool_handle()
        self.generation += 1
