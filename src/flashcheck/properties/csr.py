"""FC301 csr-well-formed: the paged CSR metadata a kernel is about to read is well formed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from flashcheck._arrays import as_host_arrays
from flashcheck.check import Check
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, Location
from flashcheck.layout import PaddingPolicy, PagedLayout
from flashcheck.properties.phases import AfterPlan, BeforeReplay, Phase, Property

__all__ = ["CSR_WELL_FORMED", "CsrInput", "check_csr", "check_layout"]

I64 = npt.NDArray[np.int64]


CSR_WELL_FORMED = Check(
    "FC301",
    "csr-well-formed",
    "property",
    doc="""\
    Paged CSR metadata (qo/kv indptr, kv indices, last_page_len) is well formed before a kernel reads it.

    What it checks
        On plan inputs, and on the persistent buffers a CUDA graph reads just before each replay:
        ``qo_indptr[0] == 0``; every indptr non-decreasing; ``kv_indptr[0] >= 0`` (a kv indptr may start at an
        offset into a shared indices array, as vLLM's prefill plan does); ``kv_indptr[-1] <= len(kv_indices)``;
        the used indices lie in ``[0, num_pages)``; ``1 <= last_page_len <= page_size`` for every non-empty real
        request; qo and kv indptr cover the same batch; ``seq_lens`` agrees with pages and last_page_len; padded
        rows follow the declared padding policy. Each failed sub-check is one finding whose evidence names the
        sub-check (``evidence["check"]``), the index and the values.

    Why it breaks serving
        FlashInfer's decode planner does not validate indptr at all: a non-monotone ``kv_indptr`` is accepted
        silently, uint32 arithmetic wraps, and whole requests are never computed (their output rows are whatever
        ``torch.empty`` held). fa3 prefill clamps negative lengths to zero. Out-of-range page ids read another
        request's KV. A polluted persistent buffer (an SGLang fork) surfaces only after minutes of serving.

    Example
        A persistent ``kv_indptr`` buffer shared with a graph-mode wrapper is rewritten inside the graph::

            wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True,
                                                         paged_kv_indptr_buffer=shared_indptr[:bs + 1], ...)
            # inside the captured forward:
            shared_indptr[1:bs + 1] = torch.cumsum(sparse_counts, 0)   # next replay plans on garbage

        gives ``kv_indptr[9]=34891 < kv_indptr[8]=36606``.

    Use instead
        Build metadata from host mirrors each step (``np.cumsum`` into a pinned buffer, then one non-blocking
        copy), keep a read-only copy of precomputed buffers and restore it before each plan, pad with the engine's
        policy (repeat the last indptr value; ``last_page_len`` 1 or 0).

    Known false positives
        A kv indptr that starts at a non-zero offset is legal and is not reported. Targets that deliberately pad
        with a policy other than the declared one are reported under ``padding-policy``; declare the right policy.
    """,
)


@dataclass(frozen=True)
class CsrInput:
    """The arrays and facts the CSR check needs. Arrays may be numpy, lists or torch tensors on any device.

    `batch_size` is the number of real rows (the rest are padding under `padding`); None means all rows are real.
    `qo_indptr` is None for decode wrappers, which have no qo indptr. `kv_indices_len` overrides
    ``len(kv_indices)`` when only a capacity is known (a persistent indices buffer is not copied).
    """

    kv_indptr: Any
    kv_indices: Any
    kv_last_page_len: Any
    num_pages: int
    page_size: int
    qo_indptr: Any = None
    seq_lens: Any = None
    batch_size: int | None = None
    padding: PaddingPolicy = PaddingPolicy.NONE
    kv_indices_len: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "padding", PaddingPolicy.parse(self.padding))


def check_layout(layout: PagedLayout, *, location: Location | None = None, prefix: str = "") -> list[Finding]:
    """Check a built `PagedLayout` (convenience over `check_csr`)."""
    return check_csr(
        CsrInput(
            kv_indptr=layout.kv_indptr,
            kv_indices=layout.kv_indices,
            kv_last_page_len=layout.kv_last_page_len,
            num_pages=layout.num_pages,
            page_size=layout.page_size,
            qo_indptr=layout.qo_indptr,
            seq_lens=layout.seq_lens,
            batch_size=layout.batch_size,
            padding=layout.padding,
        ),
        location=location,
        prefix=prefix,
    )


def check_csr(inp: CsrInput, *, location: Location | None = None, prefix: str = "") -> list[Finding]:
    """Return one finding per failed sub-check (empty when the metadata is well formed).

    `prefix` is put before array names in messages, e.g. ``"graph bs=16 "``.
    """
    loc = location or Location()
    if inp.page_size < 1 or inp.num_pages < 1:
        raise InvalidArgument(f"page_size and num_pages must be >= 1, got {inp.page_size} and {inp.num_pages}")
    # one transfer per device for every metadata array (graph buffers live on the GPU)
    kv_indptr, last, qo, seq, indices = as_host_arrays(
        [inp.kv_indptr, inp.kv_last_page_len, inp.qo_indptr, inp.seq_lens, inp.kv_indices]
    )
    assert kv_indptr is not None and last is not None and indices is not None  # required fields of CsrInput
    n_indices = len(indices) if inp.kv_indices_len is None else inp.kv_indices_len
    out: list[Finding] = []

    def add(check: str, message: str, hint: str, **evidence: Any) -> None:
        evidence["check"] = check
        out.append(CSR_WELL_FORMED.finding(prefix + message, hint=hint, location=loc, evidence=evidence))

    n_rows = len(kv_indptr) - 1
    if n_rows < 0:
        add("shape", "kv_indptr is empty", "an indptr of a batch of n requests has n + 1 entries")
        return out
    real = n_rows if inp.batch_size is None else inp.batch_size
    if real > n_rows:
        add("shape", f"batch size {real} exceeds the {n_rows} rows of kv_indptr", "size indptr as batch + 1")
        real = n_rows
    if len(last) != n_rows:
        add(
            "same-batch",
            f"kv_last_page_len has {len(last)} entries but kv_indptr covers {n_rows} requests",
            "kv_last_page_len needs one entry per request (padded rows included)",
            last_page_len_len=len(last),
            kv_rows=n_rows,
        )
    if qo is not None:
        if len(qo) != len(kv_indptr):
            add(
                "same-batch",
                f"qo_indptr covers {len(qo) - 1} requests but kv_indptr covers {n_rows}",
                "qo and kv metadata must describe the same batch (same padded size)",
                qo_rows=len(qo) - 1,
                kv_rows=n_rows,
            )
        if len(qo) and qo[0] != 0:
            add(
                "qo-indptr-start",
                f"qo_indptr[0]={int(qo[0])}, expected 0",
                "rebase qo_indptr to 0 when you slice the query tensor (q[start:] pairs with qo - qo[start])",
                index=0,
                value=int(qo[0]),
            )
        _monotone(qo, "qo_indptr", add)
    if len(kv_indptr) and kv_indptr[0] < 0:
        add(
            "kv-indptr-start",
            f"kv_indptr[0]={int(kv_indptr[0])} is negative",
            "kv_indptr entries are offsets >= 0",
            index=0,
            value=int(kv_indptr[0]),
        )
    monotone = _monotone(kv_indptr, "kv_indptr", add)
    end = int(kv_indptr[-1])
    if end > n_indices:
        add(
            "indptr-within-indices",
            f"kv_indptr[{n_rows}]={end} > len(kv_indices)={n_indices}",
            "the indices buffer must hold every page the indptr points at; grow it or fix the indptr",
            index=n_rows,
            value=end,
            indices_len=n_indices,
        )
    start = max(0, int(kv_indptr[0]))
    used = indices[start : min(end, len(indices))]
    bad = np.flatnonzero((used < 0) | (used >= inp.num_pages))
    if bad.size:
        i = int(bad[0]) + start
        add(
            "indices-in-range",
            f"kv_indices[{i}]={int(indices[i])} is outside [0, {inp.num_pages}) ({bad.size} bad entries)",
            "page ids must index the KV cache's page pool; check the block table and the allocator",
            index=i,
            value=int(indices[i]),
            num_pages=inp.num_pages,
            count=int(bad.size),
        )
    pages = np.diff(kv_indptr)
    if len(last) == n_rows and monotone:
        for i in range(real):
            if pages[i] > 0 and not 1 <= last[i] <= inp.page_size:
                add(
                    "last-page-len-range",
                    f"kv_last_page_len[{i}]={int(last[i])} is outside [1, {inp.page_size}] for a request with "
                    f"{int(pages[i])} page(s)",
                    "last_page_len = (seq_len - 1) % page_size + 1 for non-empty requests (0 means a full page "
                    "to some kernels and empty to others)",
                    index=i,
                    value=int(last[i]),
                    page_size=inp.page_size,
                )
                break
        if seq is not None and len(seq) >= real:
            for i in range(real):
                expect = 0 if pages[i] == 0 else int((pages[i] - 1) * inp.page_size + last[i])
                if int(seq[i]) != expect:
                    add(
                        "seq-lens-consistent",
                        f"seq_lens[{i}]={int(seq[i])} but pages and last_page_len give {expect}",
                        "derive seq_lens, pages and last_page_len from one source each step",
                        index=i,
                        value=int(seq[i]),
                        expected=expect,
                    )
                    break
        _check_padding(inp, real, n_rows, pages, last, qo, add)
    return out


def _monotone(arr: I64, name: str, add: Callable[..., None]) -> bool:
    d = np.diff(arr)
    bad = np.flatnonzero(d < 0)
    if bad.size == 0:
        return True
    i = int(bad[0]) + 1
    add(
        "indptr-non-decreasing",
        f"{name}[{i}]={int(arr[i])} < {name}[{i - 1}]={int(arr[i - 1])} ({bad.size} decreasing step(s))",
        f"{name} must be non-decreasing (a CSR row pointer); look for a persistent buffer written elsewhere "
        "(inside a captured graph, by another wrapper) and for padding rows not filled with the last value",
        array=name,
        index=i,
        value=int(arr[i]),
        previous=int(arr[i - 1]),
        count=int(bad.size),
    )
    return False


def _check_padding(
    inp: CsrInput, real: int, n_rows: int, pages: I64, last: I64, qo: I64 | None, add: Callable[..., None]
) -> None:
    if real == n_rows:
        return
    pol = inp.padding
    if pol is PaddingPolicy.NONE:
        add(
            "padding-policy",
            f"{n_rows - real} padded row(s) but no padding policy was declared",
            "declare the engine's padding policy (vllm_legacy, vllm_current, sglang)",
            real_rows=real,
            rows=n_rows,
        )
        return
    qo_pad = None if qo is None or len(qo) != n_rows + 1 else np.diff(qo)
    for i in range(real, n_rows):
        got = {"pages": int(pages[i]), "last_page_len": int(last[i])}
        want = {"pages": pol.padded_pages, "last_page_len": pol.padded_last_page_len}
        if qo_pad is not None:
            got["qo_len"], want["qo_len"] = int(qo_pad[i]), pol.padded_qo_len
        if got != want:
            field = next(k for k in want if got[k] != want[k])
            add(
                "padding-policy",
                f"padded row {i} has {field}={got[field]}, policy {pol.value} requires {want[field]}",
                f"fill padded rows as {pol.value} does: {want}",
                index=i,
                got=got,
                want=want,
                policy=pol.value,
            )
            return


def _on_plan(obs: AfterPlan) -> list[Finding]:
    return check_layout(obs.layout, location=obs.location)


def _before_replay(obs: BeforeReplay) -> list[Finding]:
    if obs.metadata is None:
        return []
    return check_csr(obs.metadata, location=obs.location, prefix=f"graph bs={obs.bucket}: ")


ON_PLAN_INPUTS = Property(CSR_WELL_FORMED, Phase.AFTER_PLAN, _on_plan)
# replaying malformed CSR can fault the kernel and poison the CUDA context for every later step
ON_GRAPH_BUFFERS = Property(CSR_WELL_FORMED, Phase.BEFORE_REPLAY, _before_replay, blocks=True)
