"""Neighbour store: chunk embeddings -> retrieved token chunks (namespace package)."""
import torch


class NeighbourStore:
    def __init__(self, keys, values, max_neighbours: int, device="cuda"):
        self.keys = keys.to(device)
        self.values = values.to(device)
        self.max_neighbours = max_neighbours
        self.index = None
        self._ids = []
        self._count = 0

    def _pack(self):
        assert self._count == len(self._ids)  # ok: FC109
        return torch.tensor(self._ids, dtype=torch.long)

    def lookup(self, chunk_embs, k: int):
        assert k <= self.max_neighbours  # expect: FC109
        assert self.keys.dim() == 2  # ok: FC109
        sims = chunk_embs @ self.keys.T
        top = sims.topk(k, dim=-1).indices
        return self.values[top]


def build_index(embeddings, num_lists: int):
    """Offline k-means over the datastore; run by the indexing job, not by the server."""
    centroids = embeddings[torch.randperm(embeddings.shape[0])[:num_lists]]
    for _ in range(10):
        assign = (embeddings @ centroids.T).argmax(-1)
        for c in range(num_lists):
            members = embeddings[assign == c]
            if members.shape[0]:
                centroids[c] = members.mean(0)
    return centroids.cpu().numpy()  # ok: FC101
