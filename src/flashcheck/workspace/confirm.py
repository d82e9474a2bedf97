"""GPU confirmation of the oracle: run each witness batch on the real FlashInfer wrapper (a built-in target with the
configuration's heads) under the arena, and check the bound against what the planner and the kernels use.

For every float witness: planned with a float workspace of exactly the oracle's bound, the step must run without
a finding and its high-water mark must stay within the bound; planned with one byte less than the witness needs,
the planner must overflow (FC302), which shows the per-batch sizing is exact. On FlashInfer 0.7,
``wrapper.workspace_size(...)`` is called with the arguments of every ``plan()`` and compared with the oracle's
planner for that batch. `fuzz_within_bounds` runs a built-in target's generated steps and compares every
workspace's high-water mark with the bound. torch and FlashInfer are imported lazily.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable
from typing import Any

from flashcheck.workspace.config import EngineConfig
from flashcheck.workspace.oracle import KindBound, OracleResult, UseSpec, plan_for, uses_of
from flashcheck.workspace.planner import Batch, Rules
from flashcheck.workspace.report import witness_repro

# findings that say the workspace was too small or the kernel failed (others, e.g. a known eager-path sync of
# the decode wrapper, are about other checks and are kept in the record only)
_SIZE_FINDINGS = ("FC302", "FC250", "FC251", "FC252")

__all__ = ["confirm_result", "fuzz_within_bounds", "installed_rules", "summarize"]


def installed_rules() -> Rules:
    """The planner rules of the FlashInfer this process imports (EnvironmentUnavailable without GPU or FlashInfer)."""
    from flashcheck.targets.flashinfer.compat import load_flashinfer

    fi = load_flashinfer()
    return "0.7" if fi.major_minor >= (0, 7) else "0.6"


def _scenario(cfg: EngineConfig, b: KindBound, float_bytes: int) -> dict[str, Any] | None:
    doc = witness_repro(cfg.replace(float_bytes=float_bytes), b)
    return None if doc is None else doc["scenario"]


def _run_step(scenario: dict[str, Any], spy: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Run the scenario's one step in a fresh session; the findings' IDs and the workspaces' usage."""
    from flashcheck.driver import Driver
    from flashcheck.runtime import Checker
    from flashcheck.scenario import Scenario
    from flashcheck.targets.registry import make_target

    sc = Scenario.from_dict(scenario)
    target = make_target(sc.target, **copy.deepcopy(dict(sc.target_config)))
    with Checker(layers="cheap", device="cuda") as chk:
        drv = Driver(target, chk, device="cuda", seed=sc.seed)
        drv.setup()
        if spy is not None:
            spy(target)
        res = drv.execute(sc.steps[0], 0)
        usage = dict(res.sample.workspaces) if res.sample is not None else {}
        with contextlib.suppress(Exception):  # after a planner error teardown is best effort; the result stands
            target.teardown()
    return {
        "findings": [f"{f.id}:{f.evidence.get('check', '')}" for f in res.findings],
        "messages": [f.message[:300] for f in res.findings],
        "usage": {k: [int(v[0]), int(v[1])] for k, v in usage.items()},
        "rejected": res.rejected,
    }


def _workspace_size_spy(sizes: list[Any], page_size: int = 1, absent: list[str] | None = None) -> Callable[[Any], None]:
    """Wrap the eager wrapper's ``plan`` so that every plan first asks ``workspace_size`` with the same arguments
    (FlashInfer 0.7); each entry of `sizes` is ``[float, int]`` (or the error) and the batch the plan saw. A wrapper
    without ``workspace_size`` (0.7's MLA wrapper) is named in `absent`: nothing to compare, which is not a
    disagreement."""

    def install(target: Any) -> None:
        w = getattr(target, "eager", None)
        ask = getattr(w, "workspace_size", None)
        if w is None or ask is None:
            if w is not None and absent is not None:
                absent.append(f"{type(w).__name__} has no workspace_size()")
            return
        plan = w.plan

        def spied(*a: Any, **k: Any) -> Any:
            try:
                got: Any = [int(x) for x in ask(*a, **k)]
            except Exception as exc:  # recorded: a cross-check that could not run is evidence too
                got = f"{type(exc).__name__}: {exc}"[:200]
            sizes.append((got, _batch_of(getattr(target, "kind", ""), a, page_size)))
            return plan(*a, **k)

        w.plan = spied

    return install


def _batch_of(kind: str, args: tuple[Any, ...], page_size: int) -> Batch | None:
    """The batch a decode, paged or ragged prefill ``plan(*args)`` describes (KV as whole pages: the planners
    see page counts)."""

    def diffs(t: Any) -> list[int]:
        v = [int(x) for x in t.tolist()]
        return [b - a for a, b in itertools.pairwise(v)]

    try:
        if kind == "decode":
            pages = diffs(args[0])
            return Batch.of([1] * len(pages), [p * page_size for p in pages])
        if kind in ("prefill", "ragged"):
            qo, kv = diffs(args[0]), diffs(args[1])
            return Batch.of(qo, [k * page_size for k in kv])
    except (AttributeError, IndexError, TypeError):
        return None
    return None


def confirm_result(result: OracleResult) -> list[dict[str, Any]]:
    """Run every float witness of the installed FlashInfer's rules (eager witnesses and the largest graph
    bucket) at the bound and one byte below its need; one record per witness."""
    rules = installed_rules()
    cfg = result.config
    records: list[dict[str, Any]] = []
    for spec in _chosen_uses(cfg, rules):
        b = next(x for x in result.bounds if x.use == spec.label and x.rules == rules and x.kind == "float")
        rec: dict[str, Any] = {"config": cfg.name, "use": b.use, "rules": rules, "bound": b.bound}
        rec["searched"], rec["basis"] = b.searched, b.basis
        rec["witness"] = b.witness.describe() if b.witness is not None else None
        at_bound = _scenario(cfg, b, max(b.bound, 1))
        if at_bound is None:
            rec["status"] = "no built-in target carries this use"
            records.append(rec)
            continue
        sizes: list[Any] = []
        absent: list[str] = []
        spy = _workspace_size_spy(sizes, cfg.page_size, absent) if rules == "0.7" else None
        rec["at_bound"] = _run_step(at_bound, spy)
        used = rec["at_bound"]["usage"].get("float_workspace", [-1, 0])[0]
        rec["high_water"] = used
        if rules == "0.7" and b.witness is not None and spec.bucket is None:
            want = plan_for(cfg, spec, b.witness)
            rec["workspace_size"] = [got for got, _ in sizes]
            rec["oracle_plan"] = [want.float_bytes, want.int_bytes]
            if absent:  # not compared: the wrapper offers no size to compare with
                rec["workspace_size_absent"] = absent[0]
            else:
                rec["workspace_size_agrees"] = bool(sizes) and sizes[-1][0] == rec["oracle_plan"]
        if b.searched > 0:
            below = _scenario(cfg, b, b.searched - 1)
            assert below is not None
            rec["below_need"] = _run_step(below)
        faults = [f for f in rec["at_bound"]["findings"] if f.split(":")[0] in _SIZE_FINDINGS]
        rec["ok_at_bound"] = not faults and 0 <= used <= b.bound
        rec["overflows_below_need"] = b.searched == 0 or "FC302:exception" in rec["below_need"]["findings"]
        rec["status"] = "confirmed" if rec["ok_at_bound"] and rec["overflows_below_need"] else "MISMATCH"
        records.append(rec)
    return records


def _chosen_uses(cfg: EngineConfig, rules: Rules) -> list[UseSpec]:
    out: list[UseSpec] = []
    for spec in uses_of(cfg):
        if spec.rules != rules:
            continue
        if spec.bucket is None or spec.bucket == max(cfg.graph_buckets):
            out.append(spec)
    return out


def fuzz_within_bounds(name: str, result: OracleResult, *, steps: int = 200, seed: int = 0) -> dict[str, Any]:
    """Run built-in target `name` through `steps` generated steps under the arena and compare each workspace's
    high-water mark with the oracle's bound for the installed rules (float: the largest use; int: the use
    that owns it)."""
    from flashcheck.driver import Driver
    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.runtime import Checker
    from flashcheck.targets.registry import make_target

    rules = installed_rules()
    mine = [b for b in result.bounds if b.rules == rules]
    target = make_target(name)
    peak: dict[str, int] = {}
    ran = 0
    asked: list[Any] = []
    with Checker(layers="cheap", device="cuda") as chk:
        drv = Driver(target, chk, device="cuda", seed=seed)
        drv.setup()
        if rules == "0.7":
            _workspace_size_spy(asked, target.capacity.template.page_size)(target)
        for i, st in enumerate(random_steps(target.capacity, steps, seed)):
            r = drv.execute(st, i)
            ran += 1
            if r.sample is not None:
                for ws, (used, _alloc) in r.sample.workspaces.items():
                    peak[ws] = max(peak.get(ws, -1), int(used))
    checks = []
    for ws, used in sorted(peak.items()):
        bound = _bound_for(ws, mine)
        if bound is None:
            continue
        checks.append({"workspace": ws, "high_water": used, "bound": bound, "within": used <= bound})
    out: dict[str, Any] = {"target": name, "rules": rules, "steps": ran, "workspaces": checks}
    if asked:
        out["workspace_size"] = _compare_sizes(result.config, UseSpec(result.config.wrappers[0], rules), asked)
    return out


def _compare_sizes(cfg: EngineConfig, spec: UseSpec, asked: list[Any]) -> dict[str, Any]:
    """FlashInfer's ``workspace_size()`` of each eager plan against the oracle's planner for the same batch:
    equal, oracle larger (expected only where the oracle bounds the decode grid), or oracle smaller (a bug)."""
    tally = {"equal": 0, "oracle_larger": 0, "oracle_smaller": 0, "not_comparable": 0}
    first: list[dict[str, Any]] = []
    for got, batch in asked:
        if batch is None or not isinstance(got, list):
            tally["not_comparable"] += 1
            continue
        p = plan_for(cfg, spec, batch)
        want = [p.float_bytes, p.int_bytes]
        smaller = any(w < g for w, g in zip(want, got, strict=True))
        verdict = "equal" if want == got else "oracle_smaller" if smaller else "oracle_larger"
        tally[verdict] += 1
        if verdict != "equal" and len(first) < 5:
            first.append({"batch": batch.describe()[:200], "workspace_size": got, "oracle": want, "facts": p.facts})
    return {**tally, "examples": first}


def _bound_for(ws: str, bounds: list[KindBound]) -> int | None:
    if ws.startswith("float_workspace"):
        return max((b.bound for b in bounds if b.kind == "float"), default=None)
    if ws.startswith("int_workspace["):
        tag = ws[len("int_workspace[") : -1]
        cands = [b.bound for b in bounds if b.kind == "int" and b.use.endswith(tag)]
        return max(cands) if cands else None
    return None


def summarize(records: list[dict[str, Any]]) -> str:
    lines = ["", "GPU confirmation:"]
    for r in records:
        hw = r.get("high_water", "-")
        lines.append(f"  {r['use']:<28} bound {r['bound']:>13,}  high-water {hw!s:>13}  {r['status']}")
        if "workspace_size_agrees" in r:
            lines.append(f"    workspace_size() {r['workspace_size'][-1:]} vs oracle {r['oracle_plan']}")
        elif "workspace_size_absent" in r:
            lines.append(f"    workspace_size() not compared: {r['workspace_size_absent']}")
    return "\n".join(lines) + "\n"
