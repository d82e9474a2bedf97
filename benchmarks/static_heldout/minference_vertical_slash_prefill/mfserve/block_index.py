"""Host-side conversion of an estimated vertical/slash pattern into a BSR layout."""

from dataclasses import dataclass

import numpy as np

from .patterns import VSIndex


@dataclass
class BSRLayout:
    indptr: np.ndarray
    indices: np.ndarray
    num_q_blocks: int
    num_kv_blocks: int

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])


def build_bsr(vs: VSIndex, causal: bool = True) -> BSRLayout:
    cells = vs.block_counts.tolist()  # expect: FC101
    nq, nk = vs.num_q_blocks, vs.num_kv_blocks
    mask = np.asarray(cells, dtype=np.int32).reshape(nq, nk)
    if causal:
        mask = np.tril(mask, k=nk - nq)
    mask[:, 0] = 1  # sink block
    for b in range(nq):
        mask[b, min(b + nk - nq, nk - 1)] = 1  # each query block sees its own diagonal block
    rows, cols = np.nonzero(mask)
    indptr = np.zeros(nq + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=nq), out=indptr[1:])
    return BSRLayout(indptr=indptr, indices=cols.astype(np.int32), num_q_blocks=nq, num_kv_blocks=nk)
