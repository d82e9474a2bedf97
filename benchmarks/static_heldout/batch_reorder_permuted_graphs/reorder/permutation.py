import numpy as np
import torch


def longest_first_permutation(kv_lens, bucket):
    """perm[i] = the request placed at sorted position i (longest KV first); padded rows map to themselves."""
    assert len(kv_lens) <= bucket  # expect: FC109
    order = np.argsort(-np.asarray(kv_lens, dtype=np.int64), kind="stable")
    perm = np.arange(bucket, dtype=np.int64)
    perm[: order.shape[0]] = order
    return perm


def invert(perm):
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    return inv


class PermutationState:
    """Pinned host copies of the current and previous permutation, staged for the graph inputs."""

    def __init__(self, max_batch):
        self.perm_cpu = torch.zeros(max_batch, dtype=torch.int64, pin_memory=True)
        self.inv_cpu = torch.zeros(max_batch, dtype=torch.int64, pin_memory=True)
        self.last_perm_cpu = torch.zeros(max_batch, dtype=torch.int64, pin_memory=True)
        self.n = 0

    def stage(self, perm_np, inv_np):
        n = perm_np.shape[0]
        self.last_perm_cpu[:n].copy_(self.perm_cpu[:n])
        self.perm_cpu[:n].copy_(torch.from_numpy(perm_np))
        self.inv_cpu[:n].copy_(torch.from_numpy(inv_np))
        self.n = n

    def unchanged(self):
        n = self.n
        return torch.equal(self.perm_cpu[:n], self.last_perm_cpu[:n])  # ok: FC101
