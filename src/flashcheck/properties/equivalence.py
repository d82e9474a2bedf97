"""FC303 replay-matches-eager: real output rows of a replay equal an eager run and the fp32 reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flashcheck.check import Check
from flashcheck.findings import Finding, Location
from flashcheck.properties.phases import Compare, Phase, Property

__all__ = ["REPLAY_MATCHES_EAGER", "Tolerance", "any_violation", "compare_outputs", "tolerance_for"]

REPLAY_MATCHES_EAGER = Check(
    "FC303",
    "replay-matches-eager",
    "property",
    doc="""\
    The real rows of every output equal the fp32 reference, and a graph replay equals a fresh eager run.

    What it checks
        After each step the driver compares the real output rows (padded rows are garbage by design and are
        excluded) of (a) an eager run against the fp32 reference and (b) a graph replay against the fp32
        reference and the eager run of a fresh non-graph wrapper on the same batch, within dtype tolerances (fp16
        ``atol=rtol=2e-2``, bf16 ``5e-2``, fp8 ``1.5e-1``). NaN or Inf in a real row always fails. Evidence names
        the worst row, request, head and both values. A replay is screened against the reference on the device;
        when the screen fails (or the target has no reference) the fresh eager run follows and the finding says
        which of the two diverged: ``replay vs eager`` (a replay bug) or ``eager vs reference`` (the kernel or the
        metadata is wrong outside graphs too).

    Why it breaks serving
        Replay divergence is silent: stale metadata in a persistent buffer, values frozen at capture (a scalar or
        a pinned copy), an aliased output buffer, or a kernel that accepted malformed CSR and skipped a request all
        produce plausible numbers. Capture failures are loud; these are not (NVIDIA rates them "hard").

    Example
        A replay path that forgets to refresh ``last_page_len`` for the new batch::

            self.indptr_buf[: n + 1].copy_(indptr_cpu, non_blocking=True)
            # last_page_len_buf keeps the values of the batch captured with the graph
            graph.replay()

        gives ``row 3 (request 3, head 0): replay 0.113 vs eager -0.402 (|diff| 0.515 > tol 0.028)``.

    Use instead
        Rebuild every metadata buffer the graph reads before each replay (indptr, indices, last_page_len, qo
        indptr, seq_lens), from one host-side source; never cache values in Python at capture time.

    Known false positives
        Kernels with a different accumulation order (split-KV on vs off) differ by a few ulps; the tolerances
        cover that. A target with intentionally approximate attention (fp8 KV, quantized) needs looser tolerances
        (``Tolerance``).
    """,
    hint="check that every buffer the graph reads is rewritten before replay, that the kernel accepted valid "
    "CSR (FC301), and that no value was frozen at capture",
)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


_TOL = {
    "float16": Tolerance(2e-2, 2e-2),
    "bfloat16": Tolerance(5e-2, 5e-2),
    "float8_e4m3fn": Tolerance(1.5e-1, 1.5e-1),
    "float32": Tolerance(1e-4, 1e-4),
}


def tolerance_for(q_dtype: str, kv_dtype: str) -> Tolerance:
    """The looser of the two dtypes' tolerances."""
    a, b = _TOL.get(q_dtype, _TOL["float16"]), _TOL.get(kv_dtype, _TOL["float16"])
    return Tolerance(max(a.atol, b.atol), max(a.rtol, b.rtol))


def any_violation(got: Any, want: Any, *, tol: Tolerance, rows: int) -> Any:
    """A 0-d bool tensor on the device of `got`: does an element of the first `rows` rows fail the test of
    `compare_outputs` (non-finite, or ``|got - want| > atol + rtol * |want|``)? The driver screens every output
    with it and copies outputs to the host only to explain a failure. Both are torch tensors of one shape."""
    g = got[:rows].float()
    w = want[:rows].float()
    # "every |g - w| <= atol + rtol * |w|", computed as the host's test computes it (so the two round alike);
    # NaN and infinities compare false, so non-finite elements fail it too. Nine kernel launches, in place where
    # it can be: the screen runs on every output.
    return (g - w).abs_().le_(w.abs().mul_(tol.rtol).add_(tol.atol)).all().logical_not_()


def compare_outputs(
    got: Any,
    want: Any,
    *,
    tol: Tolerance,
    what: str,
    row_to_request: Any,
    location: Location | None = None,
) -> list[Finding]:
    """Compare two [rows, H, D] host arrays; return one FC303 finding for the worst violating element, or none.

    `what` names the comparison (``"replay vs eager"``, ``"eager vs reference"``); `row_to_request` maps a row to
    its request index.
    """
    g = np.asarray(got, dtype=np.float32)
    w = np.asarray(want, dtype=np.float32)
    if g.shape != w.shape:
        return [
            _finding(
                f"{what}: output shape {tuple(g.shape)} != expected {tuple(w.shape)}",
                location,
                {"check": "shape", "got_shape": list(g.shape), "want_shape": list(w.shape), "what": what},
            )
        ]
    if g.size == 0:
        return []
    nonfinite = ~np.isfinite(g)
    diff = np.abs(g - w)
    limit = tol.atol + tol.rtol * np.abs(w)
    bad = nonfinite | (diff > limit)
    if not bad.any():
        return []
    score = np.where(nonfinite, np.inf, diff - limit)
    flat = int(np.argmax(score))
    row, head, col = (int(x) for x in np.unravel_index(flat, g.shape))
    req = int(np.asarray(row_to_request)[row])
    n_bad_rows = int(bad.reshape(bad.shape[0], -1).any(axis=1).sum())
    gv, wv = float(g[row, head, col]), float(w[row, head, col])
    msg = (
        f"{what}: row {row} (request {req}, head {head}, col {col}): {gv:.4g} vs {wv:.4g} "
        f"(|diff| {abs(gv - wv):.3g} > tol {tol.atol + tol.rtol * abs(wv):.3g}); {n_bad_rows} of {g.shape[0]} "
        "real rows differ"
    )
    return [
        _finding(
            msg,
            location,
            {
                "check": "values",
                "what": what,
                "row": row,
                "request": req,
                "head": head,
                "got": gv,
                "want": wv,
                "bad_rows": n_bad_rows,
                "rows": int(g.shape[0]),
                "nonfinite": bool(nonfinite.any()),
            },
        )
    ]


def _finding(message: str, location: Location | None, evidence: dict[str, Any]) -> Finding:
    return REPLAY_MATCHES_EAGER.finding(message, location=location, evidence=evidence)


def _screen(obs: Compare) -> Any:
    """`any_violation` of the real rows, left on the device (None when the outputs cannot be screened there)."""
    got, want = obs.got, obs.want
    if not (hasattr(got, "detach") and hasattr(want, "detach")):
        return None
    if tuple(got.shape) != tuple(want.shape) or got.device != want.device:
        return None
    tol = tolerance_for(obs.layout.spec.q_dtype, obs.layout.spec.kv_dtype)
    return any_violation(got, want, tol=tol, rows=obs.layout.real_qo_rows())


def _host(x: Any) -> Any:
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def _compare(obs: Compare) -> list[Finding]:
    """Screen on the device; copy the real rows to the host only to explain a failure (outputs of graphs and of
    the reference stay on the device)."""
    layout = obs.layout
    tol = tolerance_for(layout.spec.q_dtype, layout.spec.kv_dtype)
    rows = layout.real_qo_rows()
    flag = _screen(obs)  # one one-byte transfer; outputs that cannot be screened are compared in full
    if flag is not None and not bool(flag.item()):
        return []
    row_to_req = np.repeat(np.arange(layout.batch_size), np.diff(layout.qo_indptr[: layout.batch_size + 1]))
    got, want = _host(obs.got)[:rows], _host(obs.want)[:rows]
    return compare_outputs(got, want, tol=tol, what=obs.what, row_to_request=row_to_req, location=obs.location)


ON_COMPARE = Property(REPLAY_MATCHES_EAGER, Phase.COMPARE, _compare, screen=_screen)
