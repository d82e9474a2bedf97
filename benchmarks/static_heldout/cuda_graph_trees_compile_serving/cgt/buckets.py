import bisect
from typing import Iterable, Optional, Sequence

import torch


class BucketPolicy:
    """Small batches replay hand-captured graphs, large ones compiled graph trees."""

    def __init__(self, hand_buckets: Sequence[int], compiled_buckets: Sequence[int]):
        assert not set(hand_buckets) & set(compiled_buckets), "bucket claimed by both paths"  # expect: FC109
        self._hand = tuple(sorted(hand_buckets))
        self._compiled = tuple(sorted(compiled_buckets))
        self._all = tuple(sorted(self._hand + self._compiled))
        self._check_sorted()

    def _check_sorted(self) -> None:
        assert all(a < b for a, b in zip(self._all, self._all[1:]))  # ok: FC109

    @property
    def max_bucket(self) -> int:
        return self._all[-1]

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self._all, n)
        return self._all[i] if i < len(self._all) else None

    def is_compiled(self, bucket: int) -> bool:
        return bucket in self._compiled


def mark_dynamic_dims(tensors: Iterable[torch.Tensor], dim: int = 0) -> None:
    # page pools grow at run time; keep dynamo from specialising on their size
    for t in tensors:
        torch._dynamo.mark_dynamic(t, dim)
