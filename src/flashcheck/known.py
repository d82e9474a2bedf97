"""Known upstream behaviours: findings that are real but belong to FlashInfer (or torch), not to the code under test.

Each entry names the check, the target pattern, where the finding must point (a file suffix inside the upstream
package), the event, the versions, how many events one finding of it counts in one step, and why, with the evidence
that shows it. Matching findings are reported as *known* instead of failing;
an entry that matches nothing in a run where its target ran is reported too (like FlashInfer's fuzz ledger, an
unexpected pass is news: the upstream behaviour changed).
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from flashcheck.errors import InvalidDefinition
from flashcheck.findings import Finding
from flashcheck.runtime.checks.allocation import ALLOCATION_IN_REPLAY
from flashcheck.runtime.checks.host_sync import HOST_SYNC_IN_REPLAY

__all__ = ["KNOWN_UPSTREAM", "KnownBehaviour", "imported_flashinfer_version", "split_known", "unmatched_entries"]


# flashcheck's own package (its adapters share file names with FlashInfer's modules): a location inside it is never
# an upstream frame. The directory itself, not a path pattern: a checkout may live under a folder named flashcheck.
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)).replace("\\", "/") + "/"


@dataclass(frozen=True)
class KnownBehaviour:
    check: str
    targets: str  # fnmatch pattern over target names
    where: str  # the innermost library frame of the event (the finding's location file) must end with this
    reason: str
    versions: str = "*"  # fnmatch pattern over the FlashInfer version
    message: str = ""  # a regex the finding's message must match (the event kind, e.g. "host-to-device copy")
    label: str = ""  # a short stable name (K1, K2, ...) that counts and reports use
    # the most events one finding of it counts in one step (its evidence "count"; None: any). More means something
    # else merged into the same finding: the engine's own allocation under the same plan(), say
    per_step: int | None = None

    @property
    def key(self) -> str:
        return self.label or f"{self.check} {self.where}"

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise InvalidDefinition(f"known behaviour {self.check} for {self.targets} needs a reason")

    def matches(self, f: Finding, target: str, version: str = "") -> bool:
        if f.id != self.check or not fnmatch.fnmatch(target, self.targets):
            return False
        if version and not fnmatch.fnmatch(version, self.versions):
            return False
        if self.message and not re.search(self.message, f.message):
            return False
        count = f.evidence.get("count", 1)
        if self.per_step is not None and isinstance(count, int) and count > self.per_step:
            return False
        # the innermost frame outside flashcheck, torch and the standard library, never any frame of the stack: an
        # engine's own bug under the same plan() (a .tolist() in its metadata builder) has its own line there
        where = (f.location.file or "").replace("\\", "/")
        return where.endswith(self.where) and not where.startswith(_OWN_DIR)


_SYNC, _ALLOC = HOST_SYNC_IN_REPLAY.id, ALLOCATION_IN_REPLAY.id
KNOWN_UPSTREAM: tuple[KnownBehaviour, ...] = (
    KnownBehaviour(
        check=_SYNC,
        targets="*",
        where="flashinfer/prefill.py",
        label="K1",
        message="host-to-device copy from pageable memory",
        per_step=1,
        reason="BatchPrefillWithPagedKVCacheWrapper.plan() copies kv_lens into its device buffer from a pageable "
        "CPU tensor it builds itself (`self._kv_lens_buffer[:B].copy_(kv_lens_host, non_blocking)`): one staging "
        "copy on every plan, even when every input is pinned (K1).",
    ),
    KnownBehaviour(
        check=_SYNC,
        targets="*",
        where="flashinfer/decode.py",
        label="K4",
        message="host-to-device copy from pageable memory",
        per_step=1,
        reason="A decode wrapper built without use_cuda_graph copies the qo_indptr it builds itself on the host "
        "(`_get_range_buf(batch_size + 1, 'cpu')`, pageable) to the device in every plan(): "
        "`qo_indptr_host.to(self.device, non_blocking=...)` (decode.py:1047 in 0.6.13, :2140 in 0.7.2.post1); one "
        "staging copy per plan on the eager path that no engine input avoids (K4).",
    ),
    KnownBehaviour(
        check=_SYNC,
        targets="*",
        where="flashinfer/attention/_core.py",
        label="K5",
        per_step=4,
        reason="BatchAttention.plan() copies qo_indptr, kv_indptr and kv_len_arr to the host and then calls "
        "torch.cuda.synchronize() unconditionally (attention/_core.py:208-211 in 0.6.13): every plan of the "
        "holistic kernel stalls the host, whatever the engine passes, which is why engines do not capture it. "
        "Four events per plan (three device-to-host copies and the synchronize), so one of its findings counts at "
        "most 4 (K5).",
    ),
    KnownBehaviour(
        check=_ALLOC,
        targets="mla-*",
        where="flashinfer/mla/_batch_mla/_backends/_fa_common.py",
        label="K2",
        versions="0.7*",
        per_step=9,
        reason="FlashInfer 0.7.2's rewritten MLA wrapper allocates device memory in plan() on every re-plan of a "
        "CUDA-graph-mode wrapper, at two lines of `_fa_common.py` in 0.7.2.post1: line 549 (`_stage_metadata`, "
        "4 caching-allocator allocations per replay preparation) and line 932 (`plan_from_wrapper`). The allocator "
        "statistics (a layer named in a list) count 9 allocations across the replay preparation, and that stackless "
        "count merges into the finding at line 932, which then counts 9 (mla-fa2 and mla-fa3 in "
        "reports/raw/target_matrix-0.7.2.json; "
        "reproducers of both lines in reports/h100-campaign/repros/). 0.6.13 does not allocate there (K2).",
    ),
)


def imported_flashinfer_version() -> str:
    """The version of the FlashInfer this process imported, or "" when it has not imported it."""
    mod = sys.modules.get("flashinfer")
    return str(getattr(mod, "__version__", "")) if mod is not None else ""


def split_known(
    findings: Iterable[Finding],
    target: str,
    version: str | None = None,
    known: Iterable[KnownBehaviour] = KNOWN_UPSTREAM,
) -> tuple[list[Finding], list[tuple[Finding, KnownBehaviour]]]:
    """(unexpected findings, [(known finding, its entry)]).

    `version` is the FlashInfer version entries are matched against (default: the one imported; "" matches every
    entry's versions).
    """
    entries = tuple(known)
    if version is None:
        version = imported_flashinfer_version()
    unexpected: list[Finding] = []
    hits: list[tuple[Finding, KnownBehaviour]] = []
    for f in findings:
        k = next((e for e in entries if e.matches(f, target, version)), None)
        if k is None:
            unexpected.append(f)
        else:
            hits.append((f, k))
    return unexpected, hits


def unmatched_entries(
    hits: Iterable[str],
    targets: Iterable[str],
    version: str,
    known: Iterable[KnownBehaviour] = KNOWN_UPSTREAM,
) -> list[KnownBehaviour]:
    """The entries that apply to a run (it imported FlashInfer `version`, which matches the entry's versions, and a
    target that ran matches its pattern) but matched no finding in it (`hits`: the keys of the entries that did).
    Like an unexpected pass in FlashInfer's own fuzz ledger, this is news: the upstream behaviour changed, or the run
    never reached the code path (say which before deleting the entry)."""
    if not version:  # FlashInfer never loaded (the CPU reference target): no upstream entry applies
        return []
    seen, ran = set(hits), list(targets)
    return [
        e
        for e in known
        if e.key not in seen
        and any(fnmatch.fnmatch(t, e.targets) for t in ran)
        and fnmatch.fnmatch(version, e.versions)
    ]
