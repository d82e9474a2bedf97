"""The workspace arena: workspaces with guard zones, sentinel fill before a step, high-water-mark scan after it.

`Arena.workspace` hands out a uint8 tensor of exactly the requested size that lives inside a larger buffer with a
guard zone before and after it. `arm()` fills every usable region with a sentinel byte that alternates between 0xA5
and 0x5A from one arm to the next (data that equals one sentinel cannot hide usage twice) and re-fills the guard
zones with a pattern that alternates too. `scan()` computes the high-water mark of each workspace with vectorised
torch ops, checks the guard zones and returns FC302 findings plus ``name -> (used, allocated)``. It works on CPU
tensors (CI) and CUDA tensors alike. torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashcheck._arrays import as_host_arrays
from flashcheck._cuda_graphs import GraphCache
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, Location
from flashcheck.runtime.api import WorkspaceKind
from flashcheck.runtime.checks.workspace import WORKSPACE_WITHIN_BOUNDS

if TYPE_CHECKING:
    import torch

__all__ = ["GUARD_BYTES", "GUARD_PATTERNS", "SENTINELS", "Arena", "WorkspaceUsage"]

SENTINELS = (0xA5, 0x5A)
GUARD_PATTERNS = (0xC3, 0x3C)
GUARD_BYTES = 4096  # a multiple of 256 keeps the usable region as aligned as the allocation itself
_BLOCK = 4096
_KINDS = ("float", "int", "pinned", "engine")
ReadContext = Callable[[], contextlib.AbstractContextManager[None]]


@dataclass
class _Workspace:
    name: str
    kind: WorkspaceKind
    nbytes: int
    backing: torch.Tensor | None  # None for adopted (engine-owned) buffers: no guard zones
    usable: torch.Tensor  # flat uint8 view of exactly nbytes
    guard: int
    sentinel_ok: bool  # the usable region may be overwritten with the sentinel before a step
    zero: bool  # the usable region was zero-filled at creation (baseline 0 until the first arm)
    armed_sentinel: int | None = None
    guard_byte: int = GUARD_PATTERNS[0]
    max_used: int = -1


@dataclass(frozen=True)
class WorkspaceUsage:
    """Usage of one workspace at one scan. `used` is -1 when it cannot be measured (not sentinel-filled)."""

    name: str
    kind: str
    allocated: int
    used: int
    max_used: int
    overflow_bytes: int


@dataclass(frozen=True)
class ArenaProbe:
    """A scan's launched device reductions (`Arena.probe`): per device, its workspaces, the byte each held before
    the step, and the [workspaces, 3] int64 result tensor."""

    groups: list[list[_Workspace]]
    bases: list[list[int | None]]
    results: list[Any]


class Arena:
    """Workspaces with guard zones and high-water-mark measurement (implements `ArenaLike`).

    Args:
        guard_bytes: size of each guard zone (rounded up to a multiple of 256).
        reader: a context manager factory the scan runs under (the checker passes ``checker_read`` so that the
            arena's own device reads never count as violations).
        sink: called with the findings of every scan (the checker queues them for ``drain_findings``).
        graphs: on CUDA, record `arm` and `scan` as CUDA graphs once their inputs repeat and replay them (one
            launch instead of a dozen kernels per workspace); False keeps every step eager.
    """

    def __init__(
        self,
        *,
        guard_bytes: int = GUARD_BYTES,
        reader: ReadContext | None = None,
        sink: Callable[[list[Finding]], None] | None = None,
        graphs: bool = True,
    ) -> None:
        if guard_bytes < 0:
            raise InvalidArgument(f"guard_bytes must be >= 0, got {guard_bytes}")
        self.guard_bytes = -(-guard_bytes // 256) * 256
        self._reader = reader
        self._sink = sink
        self._ws: dict[str, _Workspace] = {}
        self._arms = 0
        self.last_usage: dict[str, WorkspaceUsage] = {}
        self.graphs = GraphCache() if graphs else None

    # -------------------------------------------------------------------------------------------- creation
    def workspace(
        self,
        name: str,
        nbytes: int,
        *,
        device: Any,
        kind: WorkspaceKind = "float",
        zero: bool = True,
        keep_zero: bool | None = None,
    ) -> torch.Tensor:
        """A uint8 tensor of exactly `nbytes` on `device`, with guard zones around it.

        `kind` ``"pinned"`` allocates page-locked host memory (pageable when no CUDA device is present, as on CI).
        `zero` zero-fills the usable region now. `keep_zero` (default: ``zero and kind == "engine"``) marks a
        workspace whose content the kernel needs to stay zero (semaphores, counters): it is never sentinel-filled,
        its guards are still checked and its high-water mark is the last non-zero byte (a lower bound).
        """
        import torch

        if kind not in _KINDS:
            raise InvalidArgument(f"workspace kind {kind!r} is not one of {', '.join(_KINDS)}")
        if nbytes < 0:
            raise InvalidArgument(f"workspace {name!r}: nbytes must be >= 0, got {nbytes}")
        if name in self._ws:
            raise InvalidArgument(f"workspace {name!r} already exists; names identify workspaces in reports")
        g = self.guard_bytes
        if kind == "pinned":
            dev = torch.device("cpu")
            backing = torch.empty(nbytes + 2 * g, dtype=torch.uint8, device=dev, pin_memory=_can_pin())
        else:
            backing = torch.empty(nbytes + 2 * g, dtype=torch.uint8, device=torch.device(device))
        guard_byte = GUARD_PATTERNS[self._arms % 2]
        backing.fill_(guard_byte)
        usable = backing[g : g + nbytes]
        if zero:
            usable.zero_()
        keep = (zero and kind == "engine") if keep_zero is None else keep_zero
        self._ws[name] = _Workspace(name, kind, nbytes, backing, usable, g, not keep, zero, guard_byte=guard_byte)
        self._changed()
        return usable

    def adopt(self, name: str, tensor: torch.Tensor, *, kind: WorkspaceKind = "engine", sentinel: bool = False) -> None:
        """Track an engine-owned buffer (no guard zones). With `sentinel`, `arm()` overwrites it and `scan()`
        reports its high-water mark; only allow that when the engine rewrites the buffer every step."""
        import torch

        if name in self._ws:
            raise InvalidArgument(f"workspace {name!r} already exists; names identify workspaces in reports")
        if not tensor.is_contiguous():
            raise InvalidArgument(f"adopted buffer {name!r} must be contiguous to be viewed as bytes")
        flat = tensor.reshape(-1).view(torch.uint8)
        self._ws[name] = _Workspace(name, kind, flat.numel(), None, flat, 0, sentinel, False)
        self._changed()

    def _changed(self) -> None:
        if self.graphs is not None:
            self.graphs.invalidate()

    def names(self) -> list[str]:
        return list(self._ws)

    # ------------------------------------------------------------------------------------------- arm / scan
    @property
    def sentinel(self) -> int | None:
        """The sentinel byte of the current arm (None before the first arm)."""
        return SENTINELS[(self._arms - 1) % 2] if self._arms else None

    def arm(self) -> None:
        """Sentinel-fill the usable region of every workspace that tolerates it and re-pattern the guard zones."""
        self._arms += 1
        s = SENTINELS[(self._arms - 1) % 2]
        gb = GUARD_PATTERNS[self._arms % 2]
        with self._read():
            for ws in self._ws.values():
                if ws.sentinel_ok:
                    ws.armed_sentinel = s
                if ws.backing is not None and ws.guard:
                    ws.guard_byte = gb
            for dev, group in self._by_device().items():
                fill = functools.partial(_fill, group, s, gb)
                if self.graphs is not None and dev.startswith("cuda"):  # pragma: no mutate (CUDA only)
                    self.graphs.run(("arm", dev, s, gb), fill)  # pragma: no mutate (CUDA only)
                else:
                    fill()

    def scan(self, step: int | None = None) -> tuple[list[Finding], dict[str, tuple[int, int]]]:
        """After run / replay: (FC302 findings, name -> (used bytes, allocated bytes)); used is -1 if unknown.

        Every workspace is reduced on its own device, down to its exact high-water mark, and the results come back
        in one transfer per device: a scan costs one host sync, not a few per workspace (on CUDA, one graph launch
        once the sentinel pattern repeats). `probe` and `account` are its two halves, for a caller that reads the
        reductions later, together with its own.
        """
        with self._read():
            probe = self._probe()
            return self._account_all(probe, [t.cpu().tolist() for t in probe.results], step)

    def probe(self) -> ArenaProbe:
        """Launch the device-side reductions of a scan (one [workspaces, 3] int64 tensor per device); nothing is
        read yet. Valid until the next `probe` or `arm`."""
        with self._read():
            return self._probe()

    def account(
        self, probe: ArenaProbe, rows: list[list[list[int]]], step: int | None = None
    ) -> tuple[list[Finding], dict[str, tuple[int, int]]]:
        """The findings and usage of a `probe` whose results (`rows`, one list per device) were read to the host."""
        with self._read():
            return self._account_all(probe, rows, step)

    def _probe(self) -> ArenaProbe:
        groups, bases, results = [], [], []
        for dev, group in self._by_device().items():
            b = [self._base(ws) for ws in group]
            probe = functools.partial(_probe_all, group, b, dev)
            # pragma: no mutate start (CUDA only: the GPU tests run the recorded scan)
            if self.graphs is not None and dev.startswith("cuda"):
                key = ("scan", dev, *((x, ws.guard_byte) for ws, x in zip(group, b, strict=True)))
                result = self.graphs.run(key, probe)
            else:
                result = probe()
            # pragma: no mutate end
            groups.append(group)
            bases.append(b)
            results.append(result)
        return ArenaProbe(groups, bases, results)

    def _account_all(
        self, probe: ArenaProbe, rows: list[list[list[int]]], step: int | None
    ) -> tuple[list[Finding], dict[str, tuple[int, int]]]:
        findings: list[Finding] = []
        usage: dict[str, tuple[int, int]] = {}
        for group, bases, result in zip(probe.groups, probe.bases, rows, strict=True):
            for ws, base, p in zip(group, bases, result, strict=True):
                f, u = self._account(ws, step, base, p, p[2])
                findings.extend(f)
                usage[ws.name] = (u.used, u.allocated)
                self.last_usage[ws.name] = u
        if findings and self._sink is not None:
            self._sink(findings)
        return findings, usage

    def _by_device(self) -> dict[str, list[_Workspace]]:
        out: dict[str, list[_Workspace]] = {}
        for ws in self._ws.values():
            out.setdefault(str(ws.usable.device), []).append(ws)
        return out

    def _read(self) -> contextlib.AbstractContextManager[None]:
        return self._reader() if self._reader is not None else contextlib.nullcontext()

    @staticmethod
    def _base(ws: _Workspace) -> int | None:
        """The byte the usable region held before the step (the sentinel, or 0 for a zeroed one); None: unknown."""
        return ws.armed_sentinel if ws.armed_sentinel is not None else (0 if ws.zero else None)

    def _account(
        self, ws: _Workspace, step: int | None, base: int | None, probe: list[int], last: int
    ) -> tuple[list[Finding], WorkspaceUsage]:
        out: list[Finding] = []
        overflow_end = 0
        n_after, n_before = probe[0], probe[1]
        if n_after:  # rare: find the exact span of the written guard bytes
            _, first_a, last_a = _diff_span(ws.backing[ws.guard + ws.nbytes :], ws.guard_byte)  # type: ignore[index]
            overflow_end = last_a
            out.append(self._finding(ws, step, "after", n_after, ws.nbytes + first_a, ws.nbytes + last_a))
        if n_before:
            _, first_b, last_b = _diff_span(ws.backing[: ws.guard], ws.guard_byte)  # type: ignore[index]
            out.append(self._finding(ws, step, "before", n_before, first_b - ws.guard, last_b - ws.guard))
        used = -1 if base is None else last
        if overflow_end:
            used = ws.nbytes + overflow_end
        ws.max_used = max(ws.max_used, used)
        n_over = ws.max_used - ws.nbytes if ws.max_used > ws.nbytes else 0
        return out, WorkspaceUsage(ws.name, ws.kind, ws.nbytes, used, ws.max_used, n_over)

    @staticmethod
    def _finding(ws: _Workspace, step: int | None, side: str, n: int, first: int, last: int) -> Finding:
        if side == "after":
            what = f"{n:,} byte(s) written in the guard zone after it, at offsets [{first:,}, {last:,})"
            hint = (
                "the kernel needs more workspace than was allocated: size it for the largest batch the graph "
                "replays (FlashInfer 0.7.2: wrapper.workspace_size(...)), or check the planner's inputs"
            )
        else:
            what = f"{n:,} byte(s) written in the guard zone before it, at offsets [{first:,}, {last:,})"
            hint = "something writes below the workspace's start: a negative offset or a neighbour's overflow"
        at_least = " (the whole guard zone was written: the overflow may reach further)" if n == ws.guard else ""
        return WORKSPACE_WITHIN_BOUNDS.finding(
            f"workspace `{ws.name}` ({ws.kind}, {ws.nbytes:,} bytes) overflowed: {what}{at_least}",
            hint=hint,
            location=Location(step=step),
            evidence={
                "check": f"guard-{side}",
                "workspace": ws.name,
                "workspace_kind": ws.kind,
                "allocated": ws.nbytes,
                "bytes_written": n,
                "first_offset": first,
                "end_offset": last,
            },
        )


def _can_pin() -> bool:
    import torch

    return bool(torch.cuda.is_available())  # pragma: no mutate (CUDA only)


def _diff_span(t: torch.Tensor, byte: int) -> tuple[int, int, int]:
    """(count, first, end) of the bytes of a (small) tensor that differ from `byte`; end is last index + 1."""
    import torch

    m = t != byte
    n = int(m.sum().item())
    if n == 0:
        return 0, 0, 0
    idx = torch.nonzero(m).flatten()
    return n, int(idx[0].item()), int(idx[-1].item()) + 1


def _last_diff(t: torch.Tensor, byte: int) -> int:
    """Index + 1 of the last byte of `t` that differs from `byte` (0 if none), without Python loops over bytes."""
    (last,) = as_host_arrays([_last_diff_dev(t, byte)])
    return 0 if last is None else int(last)


def _fill(group: list[_Workspace], sentinel: int, guard_byte: int) -> None:
    """The kernels of one arm on one device (the sentinel and guard bytes are baked into a recorded graph)."""
    for ws in group:
        if ws.sentinel_ok:
            ws.usable.fill_(sentinel)
        if ws.backing is not None and ws.guard:
            ws.backing[: ws.guard].fill_(guard_byte)
            ws.backing[ws.guard + ws.nbytes :].fill_(guard_byte)


def _probe_all(group: list[_Workspace], bases: list[int | None], dev: str) -> torch.Tensor:
    """[len(group), 3] int64 on `dev`: `_probe` of every workspace of one device, for one transfer."""
    import torch

    rows = [
        torch.stack(
            [
                torch.full((), v, dtype=torch.int64, device=dev) if isinstance(v, int) else v.to(torch.int64)
                for v in _probe(ws, b)
            ]
        )
        for ws, b in zip(group, bases, strict=True)
    ]
    return torch.stack(rows)


def _probe(ws: _Workspace, base: int | None) -> list[Any]:
    """Device-side reductions of one workspace: [guard bytes written after, before, high-water mark (-1: unknown)]."""
    n_after: Any = 0
    n_before: Any = 0
    if ws.backing is not None and ws.guard:
        n_after = (ws.backing[ws.guard + ws.nbytes :] != ws.guard_byte).sum()
        n_before = (ws.backing[: ws.guard] != ws.guard_byte).sum()
    last = _last_diff_dev(ws.usable, base) if base is not None else -1
    return [n_after, n_before, last]


def _last_diff_dev(t: torch.Tensor, byte: int) -> Any:
    """Index + 1 of the last byte of `t` != `byte` (0 if none), as a 0-d tensor on `t`'s device (no host sync).

    Blocks of 4 KiB are reduced with ``any`` first (the only full-size temporary is one mask, of 8-byte words where
    the view allows it); the last dirty block is then gathered by a device-side index and searched byte by byte.
    """
    import torch

    n = t.numel()
    full = n - n % _BLOCK
    if n == 0:
        return 0
    last: Any = 0
    if full:
        blocks = _dirty_blocks(t[:full], byte)
        blk = (_ramp(blocks.numel(), t.device) * blocks).max()  # 1-based; 0: no dirty block
        row = t[:full].view(-1, _BLOCK).index_select(0, (blk - 1).clamp(min=0).reshape(1))[0]
        in_blk = (_ramp(_BLOCK, t.device) * (row != byte)).max()
        last = torch.where(blk > 0, (blk - 1) * _BLOCK + in_blk, 0)
    if full < n:
        tail = (_ramp(n - full, t.device) * (t[full:] != byte)).max()
        last = torch.where(tail > 0, full + tail, last)
    return last


_RAMPS: dict[tuple[str, int], Any] = {}


def _ramp(n: int, device: Any) -> torch.Tensor:
    """[1, 2, ..., n] as int64 on `device`, made once per (device, n): a scan reuses it on every step."""
    import torch

    key = (str(device), n)
    r = _RAMPS.get(key)
    if r is None:
        if len(_RAMPS) >= 256:  # one or two sizes per workspace; a process with many arenas starts over
            _RAMPS.clear()
        r = _RAMPS[key] = torch.arange(1, n + 1, device=device, dtype=torch.int64)
    return r


def _dirty_blocks(t: torch.Tensor, byte: int) -> torch.Tensor:
    """[len(t) / _BLOCK] bools: block i has a byte != `byte`. Compares 8-byte words where the view allows it (an
    eighth of the mask memory traffic of a byte compare; workspaces are hundreds of MiB)."""
    import torch

    if t.storage_offset() % 8 == 0:
        word = int.from_bytes(bytes([byte]) * 8, "little", signed=True)
        return (t.view(torch.int64) != word).view(-1, _BLOCK // 8).any(dim=1)
    return (t != byte).view(-1, _BLOCK).any(dim=1)
