"""Turn a `BatchSpec` into the CSR metadata FlashInfer consumes, padded to a graph bucket if asked.

`build_paged_layout` gives `qo_indptr`, `kv_indptr`, `kv_indices`, `kv_last_page_len` and `seq_lens` (int32 numpy
arrays) under a pluggable page allocator and a named padding policy that matches a real engine.
`build_ragged_layout` gives the non-paged (`qo_indptr`, `kv_indptr`) form.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument, require

__all__ = [
    "Allocator",
    "ContiguousAllocator",
    "FragmentedAllocator",
    "PaddingPolicy",
    "PagedLayout",
    "RaggedLayout",
    "ShuffledAllocator",
    "allocator_from_name",
    "build_paged_layout",
    "build_ragged_layout",
]

I32 = npt.NDArray[np.int32]


class PaddingPolicy(str, enum.Enum):
    """How an engine fills the rows between the real batch size and the graph bucket.

    - ``none``: no padding allowed (eager paths).
    - ``vllm_legacy``: older vLLM: padded rows have 0 pages (indptr repeats its last value), ``last_page_len`` 1
      ("flashinfer treats 0 as a full page"), one padded query token each, ``seq_len`` 0.
    - ``vllm_current``: newer vLLM: 0 pages, ``last_page_len`` 0, 0 query tokens (``query_start_loc`` repeats its
      last value), ``seq_len`` 0.
    - ``sglang``: page size 1; padded requests attend to 1 token (a stale slot), so 1 page each, ``last_page_len``
      1, ``seq_len`` 1 (``get_cuda_graph_seq_len_fill_value()``), one query token.
    """

    NONE = "none"
    VLLM_LEGACY = "vllm_legacy"
    VLLM_CURRENT = "vllm_current"
    SGLANG = "sglang"

    @property
    def padded_pages(self) -> int:
        return 1 if self is PaddingPolicy.SGLANG else 0

    @property
    def padded_last_page_len(self) -> int:
        return 0 if self is PaddingPolicy.VLLM_CURRENT else 1

    @property
    def padded_qo_len(self) -> int:
        return 0 if self is PaddingPolicy.VLLM_CURRENT else 1

    @property
    def padded_seq_len(self) -> int:
        return 1 if self is PaddingPolicy.SGLANG else 0

    @classmethod
    def parse(cls, value: str | PaddingPolicy) -> PaddingPolicy:
        try:
            return cls(value)
        except ValueError:
            raise InvalidArgument(
                f"unknown padding policy {value!r}; choose one of {', '.join(p.value for p in cls)}"
            ) from None


class Allocator(Protocol):
    """Chooses which physical pages back each request. Must return distinct page ids in ``[0, num_pages)``."""

    name: str

    def allocate(self, pages_per_request: tuple[int, ...], num_pages: int, rng: np.random.Generator) -> I32: ...


class ContiguousAllocator:
    """Pages 0, 1, 2, ... in request order (what a fresh engine does)."""

    name = "contiguous"

    def allocate(self, pages_per_request: tuple[int, ...], num_pages: int, rng: np.random.Generator) -> I32:
        return np.arange(sum(pages_per_request), dtype=np.int32)


class ShuffledAllocator:
    """A random permutation of the pool: pages of one request scattered everywhere."""

    name = "shuffled"

    def allocate(self, pages_per_request: tuple[int, ...], num_pages: int, rng: np.random.Generator) -> I32:
        return rng.permutation(num_pages)[: sum(pages_per_request)].astype(np.int32)


class FragmentedAllocator:
    """A long-running engine: freed pages reused in LIFO order, so runs of ascending pages with gaps."""

    name = "fragmented"

    def allocate(self, pages_per_request: tuple[int, ...], num_pages: int, rng: np.random.Generator) -> I32:
        need = sum(pages_per_request)
        runs: list[npt.NDArray[np.int64]] = []
        free = np.ones(num_pages, dtype=bool)
        got = 0
        while got < need:
            start = int(rng.integers(0, num_pages))
            length = int(rng.integers(1, max(2, num_pages // 8)))
            idx = np.arange(start, min(num_pages, start + length))
            idx = idx[free[idx]][: need - got]
            if idx.size == 0:
                rest = np.flatnonzero(free)[: need - got]
                idx = rest
            free[idx] = False
            runs.append(idx)
            got += idx.size
        return np.concatenate(runs).astype(np.int32)


_ALLOCATORS: dict[str, type[ContiguousAllocator | ShuffledAllocator | FragmentedAllocator]] = {
    "contiguous": ContiguousAllocator,
    "shuffled": ShuffledAllocator,
    "fragmented": FragmentedAllocator,
}


def allocator_from_name(name: str) -> Allocator:
    try:
        return _ALLOCATORS[name]()
    except KeyError:
        raise InvalidArgument(f"unknown page allocator {name!r}; choose one of {', '.join(_ALLOCATORS)}") from None


@dataclass(frozen=True, eq=False)
class PagedLayout:
    """Paged CSR metadata of one batch, host-side (int32 numpy), as FlashInfer's paged wrappers take it.

    Rows ``[batch_size, padded_batch_size)`` are padding under `padding`. ``kv_indptr`` may start at an offset
    (`kv_offset`) into a shared ``kv_indices`` array, as vLLM's prefill plan does.
    """

    spec: BatchSpec
    qo_indptr: I32
    kv_indptr: I32
    kv_indices: I32
    kv_last_page_len: I32
    seq_lens: I32
    num_pages: int
    padding: PaddingPolicy
    allocator: str = "contiguous"

    @property
    def batch_size(self) -> int:
        return self.spec.batch_size

    @property
    def padded_batch_size(self) -> int:
        return len(self.kv_last_page_len)

    @property
    def page_size(self) -> int:
        return self.spec.page_size

    @property
    def kv_offset(self) -> int:
        return int(self.kv_indptr[0])

    @property
    def total_qo_rows(self) -> int:
        return int(self.qo_indptr[-1])

    def real_qo_rows(self) -> int:
        return int(self.qo_indptr[self.batch_size])

    def arrays(self) -> dict[str, I32]:
        return {
            "qo_indptr": self.qo_indptr,
            "kv_indptr": self.kv_indptr,
            "kv_indices": self.kv_indices,
            "kv_last_page_len": self.kv_last_page_len,
            "seq_lens": self.seq_lens,
        }

    def with_kv_offset(self, offset: int, filler: int = 0) -> PagedLayout:
        """The same batch placed after `offset` entries of a shared ``kv_indices`` array (vLLM prefill slice)."""
        require(offset >= 0, f"kv offset must be >= 0, got {offset}")
        pad = np.full(offset, filler, dtype=np.int32)
        return _replace_layout(
            self,
            kv_indptr=(self.kv_indptr + offset).astype(np.int32),
            kv_indices=np.concatenate([pad, self.kv_indices]).astype(np.int32),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: v.tolist() for k, v in self.arrays().items()}
        d.update(spec=self.spec.to_dict(), num_pages=self.num_pages, padding=self.padding.value)
        d["allocator"] = self.allocator
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PagedLayout:
        try:
            return cls(
                spec=BatchSpec.from_dict(d["spec"]),
                **{k: np.asarray(d[k], dtype=np.int32) for k in _ARRAYS},
                num_pages=int(d["num_pages"]),
                padding=PaddingPolicy.parse(d["padding"]),
                allocator=str(d.get("allocator", "contiguous")),
            )
        except KeyError as exc:
            raise InvalidArgument(f"PagedLayout JSON lacks field {exc}") from None


_ARRAYS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "seq_lens")


def _replace_layout(layout: PagedLayout, **changes: Any) -> PagedLayout:
    import dataclasses

    return dataclasses.replace(layout, **changes)


def build_paged_layout(
    spec: BatchSpec,
    *,
    num_pages: int | None = None,
    allocator: Allocator | str = "contiguous",
    pad_to: int | None = None,
    padding: PaddingPolicy | str = PaddingPolicy.NONE,
    seed: int = 0,
) -> PagedLayout:
    """Build the paged CSR layout of `spec`.

    Args:
        spec: the batch.
        num_pages: size of the page pool; defaults to the pages needed plus one (a spare for padding rows).
        allocator: a page allocator or its name (``contiguous``, ``shuffled``, ``fragmented``).
        pad_to: graph bucket to pad to (>= the batch size); None means no padding.
        padding: padding policy for the rows added by `pad_to`.
        seed: seeds the allocator's choices.
    """
    policy = PaddingPolicy.parse(padding)
    alloc = allocator_from_name(allocator) if isinstance(allocator, str) else allocator
    bs = spec.batch_size
    padded = bs if pad_to is None else pad_to
    require(padded >= bs, f"pad_to={pad_to} is smaller than the batch size {bs}; choose a bucket >= {bs}")
    if padded > bs and policy is PaddingPolicy.NONE:
        raise InvalidArgument(
            f"pad_to={pad_to} > batch size {bs} needs a padding policy; pass padding='vllm_legacy', "
            "'vllm_current' or 'sglang'"
        )
    if policy is PaddingPolicy.SGLANG:
        require(spec.page_size == 1, f"padding 'sglang' needs page_size 1 (SGLang's token pool), got {spec.page_size}")
    pages = spec.pages_per_request()
    need = sum(pages)
    pool = need + 1 if num_pages is None else num_pages
    spare = 1 if policy.padded_pages and padded > bs else 0
    require(
        pool >= max(1, need + spare), f"num_pages={num_pages} cannot hold the {need + spare} pages this batch needs"
    )
    rng = np.random.default_rng(seed)
    real_indices = alloc.allocate(pages, pool, rng)
    if real_indices.shape != (need,) or (need and (real_indices.min() < 0 or real_indices.max() >= pool)):
        raise InvalidArgument(f"allocator {alloc.name!r} returned pages outside [0, {pool}) or the wrong count")
    n_pad = padded - bs
    pad_pages = np.full(n_pad * policy.padded_pages, pool - 1, dtype=np.int32)  # a stale slot: the last page
    kv_pages = np.array(list(pages) + [policy.padded_pages] * n_pad, dtype=np.int64)
    kv_indptr = np.zeros(padded + 1, dtype=np.int32)
    kv_indptr[1:] = np.cumsum(kv_pages)
    qo = np.array(list(spec.qo_lens) + [policy.padded_qo_len] * n_pad, dtype=np.int64)
    qo_indptr = np.zeros(padded + 1, dtype=np.int32)
    qo_indptr[1:] = np.cumsum(qo)
    kv = np.array(spec.kv_lens, dtype=np.int64)
    last = (kv - 1) % spec.page_size + 1
    last_page_len = np.concatenate([last, np.full(n_pad, policy.padded_last_page_len)]).astype(np.int32)
    seq_lens = np.concatenate([kv, np.full(n_pad, policy.padded_seq_len)]).astype(np.int32)
    return PagedLayout(
        spec=spec,
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        kv_indices=np.concatenate([real_indices, pad_pages]).astype(np.int32),
        kv_last_page_len=last_page_len,
        seq_lens=seq_lens,
        num_pages=pool,
        padding=policy,
        allocator=alloc.name,
    )


@dataclass(frozen=True, eq=False)
class RaggedLayout:
    """Non-paged (ragged) layout: K/V of request i are rows ``kv_indptr[i]:kv_indptr[i+1]`` of one tensor."""

    spec: BatchSpec
    qo_indptr: I32
    kv_indptr: I32

    @property
    def batch_size(self) -> int:
        return self.spec.batch_size


def build_ragged_layout(spec: BatchSpec) -> RaggedLayout:
    qo = np.zeros(spec.batch_size + 1, dtype=np.int32)
    kv = np.zeros(spec.batch_size + 1, dtype=np.int32)
    np.cumsum(spec.qo_lens, out=qo[1:], dtype=np.int32)
    np.cumsum(spec.kv_lens, out=kv[1:], dtype=np.int32)
    return RaggedLayout(spec=spec, qo_indptr=qo, kv_indptr=kv)
