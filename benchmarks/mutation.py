"""Mutation score of the modules `[tool.mutmut]` in pyproject.toml names: how many single-line mutants of a detector,
a property, the error classification or a static rule the tests notice. Runs `mutmut run` (pip install mutmut; CPU
only), keeps each group's per-mutant results in reports/raw/mutation.json, then writes reports/mutation.md from that
file: the command and date of each group's run, the score of each module group and every surviving mutant's diff,
so the survivors are a worklist of missing tests.

    python benchmarks/mutation.py                    # run every group and write reports/mutation.md
    python benchmarks/mutation.py --group rules      # run these groups again; the others keep their raw results
    python benchmarks/mutation.py --no-run           # write the report from reports/raw/mutation.json

One configuration covers every group: mutmut runs, for each mutant, only the tests that reached the mutated
function, so a group costs what its own tests cost.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "mutation.md"
RAW = ROOT / "reports" / "raw" / "mutation.json"
_DETECTED = ("killed", "timeout")  # mutmut counts a mutant that makes the tests run past its limit as killed
_RESULT = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>.+)$")

# group -> module prefixes of the mutant names (mutmut names a mutant module.x_function__mutmut_N)
GROUPS: dict[str, tuple[str, ...]] = {
    "properties": ("flashcheck.properties.",),
    "monitor": ("flashcheck.runtime.monitor.",),
    "hooks": ("flashcheck.runtime.hooks.",),
    "arena": ("flashcheck.runtime.arena.",),
    "classification": ("flashcheck.targets.classify.", "flashcheck.known."),
    "rules": ("flashcheck.verifier.rules.",),
}

# Survivors that cannot change what a test can observe, as (function name part, regex over the diff, why). A rule
# names the exact change: anything else a mutant does stays in the worklist.
EQUIVALENT: tuple[tuple[str, str, str], ...] = (
    (
        "",
        r"capture_stack\(\d\)",
        "skips one more of flashcheck's own frames (or mutmut's trampoline): the user's line is the same",
    ),
    (
        "",
        r"zip\([^)]*(strict=(None|False)|, \))",
        "`zip`'s strict flag: the sequences have one length, or the flag was False",
    ),
    ("_finding", r"^-\s+severity=severity,$", "ERROR is the default severity of a Finding"),
    (
        "_caller",
        r"sys\._getframe\(\d\)",
        "the walk up to the backend's callback starts a frame higher: it finds the same frame",
    ),
    (
        "start",
        r"range\((2048|1, 2049)\)",
        "callback id 0 is CUPTI's INVALID and no API has id 2048: the same ids are enabled",
    ),
    ("copy_args", r"p\.(dst|src) or 1", "only a NULL pointer differs, which cudaMemcpyAsync rejects before copying"),
    ("_memory_type", r"ctypes\.c_uint\(1\)", "the driver writes the value when it answers; on an error it is not read"),
    (
        "close",
        r'self\._on_call = ""',
        "close() also empties the call table, so a late callback finds nothing to pass on",
    ),
    (
        "_on_call",
        r"sink is None and backend is None",
        "the backend is set before CUPTI can call back and the sink is gone once it is not: both or neither are None",
    ),
    (
        "__init__",
        r"^\+\s+self\.(_hot(_depth)?|_prev_mode|_prev_show|_filter|_pushed_by|_prof|_pending|_callbacks|installed|_depth"
        r"|_excluded|_start|_outer|_prev_own|_wrapper|_active|_seen|_last|_last_copy|_pinned|_cupti|_subscriber|_calls"
        r"|_on_call)"
        r"(: [^=]+)? = ",
        "a field that install() sets again before any use",
    ),
    (
        "_uninstall",
        r"^\+\s+self\.(_hot|_hot_depth|_callbacks|_depth, self\._start.*) = ",
        "install() sets it again before any use",
    ),
    ("ǁ_uninstall", r"self\._active = (None|True)", "the wrapper also needs the sink, which uninstall drops"),
    ("_uninstall", r"range\(len\(lst\) - 1, -2, -1\)", "the extra index -1 is the last entry, already compared"),
    ("_warm_up", r"", "warms torch's lazy imports up: any op under the bare mode does"),
    (
        "_chain",
        r"orig = |_showwarnmsg_impl\", \)|prev is None and|impl is None\)|impl is not None\)",
        "calling `_showwarning_orig` reaches the same `_showwarnmsg_impl` the direct path calls",
    ),
    (
        "_remove_warning_hook",
        r"_filters_mutated|mutated is None|self\._filter = |self\._prev_show = \"\"",
        "the filter cache version is internal to `warnings`; the fields are set again on install",
    ),
    (
        "ǁenter",
        r"RegionRecord\((None|1), |step_name, (None|1), \(\)|step_name, 0, None,",
        "open() sets the id, the thread and the enclosing regions before any use",
    ),
    (
        "x__torch_set_mode",
        r"getattr\(None, |\"(XX_cuda_set_sync_debug_modeXX|_CUDA_SET_SYNC_DEBUG_MODE)\"",
        "`torch.cuda.set_sync_debug_mode` sets the same mode through the same binding (with argument parsing); a "
        "CPU build has no binding, so both ways call it",
    ),
    ("ǁrefresh", r"filters is self\._seen\[1\]", "the fast path is never taken: the full re-hook check finds the same"),
    ("ǁarm", r"self\._arms (-|\+)= |self\._arms \+ 1\) % 2", "only the parity of the arm count is used"),
    ("ǁarm", r"ws\.backing is not None or ws\.guard", "guard bytes of a buffer without guard zones are never read"),
    ("x__probe", r"ws\.backing is not None or ws\.guard", "an adopted buffer has no guard zone to read"),
    (
        "x__ramp",
        r"device=None|dtype=None|arange\(1, n \+ 1, (dtype=torch\.int64|device=device, )\)",
        "CPU is the default device; an integer range is int64 already",
    ),
    ("x__last_diff_dev", r"_ramp\([^)]*, None\)", "CPU is the default device"),
    ("x__last_diff", r"last is None", "the device value is 0 or a 0-d tensor, never None"),
    (
        "x__dirty_blocks",
        r"storage_offset\(\)",
        "the word and the byte comparison give the same blocks; only the cost differs",
    ),
    (
        "x__probe",
        r"else [+-]\d$|\(base is not None\) or True",
        "an unknown base's high-water mark is never read: the usage is -1",
    ),
    (
        "ǁ_account",
        r"\(base is None\) and False|overflow_end = None",
        "the probe's mark is -1 itself for an unknown base; None and 0 are both no overflow",
    ),
    ("ǁ_account", r"ws\.max_used >= ws\.nbytes", "at equality the overflow is 0 either way"),
    (
        "ǁadopt",
        r"flat, (None|1), sentinel|sentinel, None\)",
        "an adopted buffer has no guard zone; None and False are both not zeroed",
    ),
    ("ǁscan", r"bases, None\)", "CPU is the default device"),
    (
        "ǁworkspace",
        r"device=None|dtype=torch\.uint8, \)|device=dev, \)|pin_memory=None|dev = None|dtype=torch\.uint8, pin_",
        "CPU is the default device; pinning needs CUDA",
    ),
    ("x__probe_all", r"device=None|dtype=None|, device=dev\)", "CPU is the default device; an integer fill is int64"),
    (
        "x__dirty_blocks",
        r"\"little\"|signed=(None|False)|signed=True\)",
        "eight equal bytes read the same in either "
        "order; the comparison of a uint8 view is the same for a signed or unsigned word of them",
    ),
    ("x__can_pin", r"", "CUDA only"),
    ("ǁ_CudaStreamOpsǁ", r"", "CUDA only: the CPU tests inject a `StreamOps`"),
    ("unavailable_reason", r"\(torch\.cuda\.is_available\(\)\) and False", "CUDA is absent on the CPU machine"),
    ("ǁregion_exit", r"self\._start is None and self\._outer is None", "the two are set and cleared together"),
    (
        "ǁread_end",
        r"self\._depth or self\._read_start",
        "a read left open when its region closed is dropped at the next region's start",
    ),
    ("x__classify", r"or \"XXXX\"", "an unknown memory name is unknown memory either way"),
    (
        "x_compare_outputs",
        r"^\+\s+None,$|reshape\(bad\.shape\[0\], -2\)",
        "a None location is the default one; numpy reads any negative size as the unknown one",
    ),
    ("x__host", r"asarray\(x, (dtype=None)?\)", "compare_outputs converts its inputs to float32 itself"),
    ("ǁend_read", r"pop\(t, \)", "the thread's entry exists: its depth was one"),
    ("x_check_csr", r"assert kv_indptr is not None", "a type guard: CsrInput requires the three fields"),
    ("x__default_profiler", r"", "CUDA only: on CPU torch.profiler records the CPU activity by default"),
    ("x__stream_capturing", r"", "CUDA only"),
    ("x_classify_exception", r"^\+\s+break$", "the only row with exception types is the last one"),
    ("x_imported_flashinfer_version", r"\(mod is not None\) or True", 'the version of no module is "" either way'),
    ("ǁmatches", r"get\(\"count\", (None)?\)", "a finding without a count is within every count of one or more"),
    ("ǁmatches", r"f\.location\.file or \"XXXX\"", "a file-less finding matches only an entry with an empty path"),
    ("x_finding_from_exception", r"fs\.lineno or 1", "a traceback frame always has a line number"),
    # static rules
    (
        "x__resolved_name",
        r"partition\(\"XX\.XX\"\)|if \(rest\) and False",
        "the only torch functions of the rule's sets under a submodule are `synchronize`s, which the method-name "
        "check reports whatever name resolves",
    ),
    (
        "_cpu_positional",
        r"startswith\(\"(XXtorch\.XX|TORCH\.)\"\)|dotted\(None\)|dotted\(a\) or \"XXXX\"|^\+\s+d = None$|^\+\s+break$",
        "a `torch.*` argument of `.to()` is a dtype: no dtype is named with a cpu/host word, so it never reads as "
        "the host either way",
    ),
    ("x__is_mask", r"local_assigns\.get\(index\.id, (None)?\)", "a name with no local binding is no mask either way"),
    ("_check_fn", r"call\.args\[:3\]", "the third argument of torch.equal/allclose is a tolerance, not a tensor"),
    (
        "ǁFlashinferPrivateAttributeǁcheck",
        r"startswith\(\"_\"\) or not|startswith\(\"XX__XX\"\)",
        "every name of the private sets starts with one underscore: `_check` drops any other name either way",
    ),
    ("ǁ_Flowǁ_bound", r"\(\"(XXwrapperXX|WRAPPER)\", b\.wrapper", "a finding shows only the key's buffer name"),
    ("ǁ_Flowǁ_transitive", r"memo\[key\] = None", "None and False are both no"),
    ("_check_order", r"getattr\(node, \"lineno\", (None|1)?\)", "every statement and call has a line number"),
    (
        "ǁEmptyWorkspaceForZeroingKernelǁcheck",
        r"kind = \((dotted|torch_name)\((alloc\.func|None)(, where)?\) (or|and) terminal_name\((alloc\.func|None)\) "
        r"(or|and) \"(XXXX)?\"\)"
        r"\.rsplit\(\"\.\", (1|2)?\)\[(-|\+)1\]",
        "allocations() yields calls of dotted `torch.*`/`x.new_*` names: the fallbacks are never reached and every "
        "split gives the same last part",
    ),
    (
        "x__size_arg",
        r"name = \((dotted\(alloc\.func\)|torch_name\(alloc\.func, fn\)) or \"(XXXX)?\"\)\.(r?split)\(\"\.\", (1|2)?\)"
        r"\[(-|\+)1\]",
        "allocations() yields two-part `torch.<factory>` names: every split gives the same factory name",
    ),
    (
        "",
        r"(dotted\((value|call|expr)\.func\)|torch_name\((value|alloc)\.func, fn\)|terminal_name\((value\.func|t)\))"
        r" or \"XXXX\"",
        'an unnamed callee or target matches no allocator, getter or workspace name, as "" does not',
    ),
    (
        "x__is_fresh_tensor",
        r"last = name\.(r?split)\(\"\.\", (1|2)?\)\[(-|\+)1\]",
        "torch_name gives two-part `torch.<factory>` names for the factories and copies it looks for: every split "
        "gives the same last part",
    ),
    ("x__local_key", r"if \(key in built\) or True", "a key that built lacks is skipped by the caller's lookup"),
    ("ǁNonGraphWrapperInCaptureǁcheck", r"built\.get\(key, (None)?\)", "a missing key is skipped either way"),
    (
        "x__derived",
        r"if grown < tainted:",
        "grown equals tainted only when nothing new was derived: another round adds nothing either",
    ),
    (
        "x__fed_by_public_callers",
        r"^\+\s+params = \[p for p in fn\.params if p not in \(\"(XXselfXX|SELF|self)\", \"(cls|XXclsXX|CLS)\"\)\]",
        "a call's receiver is no argument that a caller derives from its own inputs",
    ),
    (
        "x_check_output_contract",
        r"want_device\.(r?split)\(\":\", (maxsplit=\d)?\)\[0\]",
        "the part before the first colon is the same",
    ),
)


def _mutmut(*args: str, timeout: int = 7200) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:  # e.g. the tests fail without any mutant: no result of this run is meaningful
        raise SystemExit(f"mutmut {args[0]} failed (exit {proc.returncode}):\n{out[-3000:]}")
    return out


def results() -> dict[str, str]:
    """Mutant name -> status (killed, survived, timeout, ...) of the last run (`mutmut results --all true`)."""
    out: dict[str, str] = {}
    for line in _mutmut("results", "--all", "true").splitlines():
        m = _RESULT.match(line)
        if m:
            out[m.group("name")] = m.group("status").strip()
    return out


_DIFFS = """
import contextlib, io, json, sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
out = {}
for n in json.load(sys.stdin):
    with contextlib.redirect_stdout(io.StringIO()):
        out[n] = get_diff_for_mutant(n, path=find_mutant(n).path)
json.dump(out, sys.stdout)
"""


def diffs(names: list[str]) -> dict[str, list[str]]:
    """The changed lines of each mutant (one process for all: `mutmut show` costs a start-up per mutant)."""
    proc = subprocess.run(
        [sys.executable, "-c", _DIFFS],
        cwd=ROOT,
        input=json.dumps(names),
        capture_output=True,
        text=True,
        check=True,
    )
    raw: dict[str, str] = json.loads(proc.stdout)
    return {
        n: [ln for ln in d.splitlines() if ln.startswith(("-", "+")) and not ln.startswith(("---", "+++"))][:8]
        for n, d in raw.items()
    }


_LITERAL = re.compile(r"\"[^\"]*\"|'[^']*'")


def text_only(diff: list[str]) -> bool:
    """True when a mutant only rewrites the wording of a message or hint: a string literal with a space in it,
    wrapped in ``XX`` or with its case changed. Single words (dict keys, region and check names) are behaviour."""
    minus = [ln[1:].strip() for ln in diff if ln.startswith("-")]
    plus = [ln[1:].strip() for ln in diff if ln.startswith("+")]
    if len(minus) != 1 or len(plus) != 1:
        return False
    a, b = _LITERAL.findall(minus[0]), _LITERAL.findall(plus[0])
    if len(a) != len(b) or _LITERAL.sub('""', minus[0]) != _LITERAL.sub('""', plus[0]):
        return False
    changed = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    return bool(changed) and all(" " in x and (x.lower() == y.lower() or y.replace("XX", "") == x) for x, y in changed)


def equivalent(name: str, diff: list[str]) -> str | None:
    """Why a surviving mutant is equivalent (see `EQUIVALENT`), or None."""
    fn = name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1]
    changed = [ln for ln in diff if ln.startswith(("-", "+"))]
    for part, pattern, why in EQUIVALENT:
        if part in fn and any(re.search(pattern, ln) for ln in changed):
            return why
    return None


def group_of(name: str) -> str:
    return next((g for g, prefixes in GROUPS.items() if name.startswith(prefixes)), "other")


def load_raw() -> dict[str, Any]:
    """reports/raw/mutation.json: per group the command, date and per-mutant status of its last run, and the
    diff of every surviving mutant."""
    if RAW.is_file():
        raw: dict[str, Any] = json.loads(RAW.read_text(encoding="utf-8"))
        return raw
    return {"groups": {}, "diffs": {}}


def record(raw: dict[str, Any], groups: list[str], statuses: dict[str, str], command: str) -> None:
    """Replace the raw results of `groups` with this run's (mutants of other groups keep their last run's)."""
    for g in groups:
        mine = {n: s for n, s in sorted(statuses.items()) if group_of(n) == g and s != "not checked"}
        raw["groups"][g] = {
            "command": command,
            "date": time.strftime("%Y-%m-%d"),
            "mutmut": _version("mutmut"),
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
            "statuses": mine,
        }
    alive = {n for g in raw["groups"].values() for n, s in g["statuses"].items() if s not in _DETECTED}
    fresh = sorted(n for n in alive if group_of(n) in groups)
    kept = {n: v for n, v in raw["diffs"].items() if n in alive and group_of(n) not in groups}
    raw["diffs"] = dict(sorted({**kept, **(diffs(fresh) if fresh else {})}.items()))


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def render(raw: dict[str, Any], command: str) -> str:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    statuses = {n: s for g in raw["groups"].values() for n, s in g["statuses"].items()}
    survivors = sorted(n for n, s in statuses.items() if s not in _DETECTED)
    d: dict[str, list[str]] = raw["diffs"]
    text = {n for n in survivors if text_only(d[n])}
    why = {n: w for n in survivors if n not in text and (w := equivalent(n, d[n])) is not None}
    total, killed = len(statuses), sum(s in _DETECTED for s in statuses.values())
    behaviour = total - len(text) - len(why)
    runs = sorted({(g["date"], g["command"], g["mutmut"], g["python"], g["machine"]) for g in raw["groups"].values()})
    lines = [
        "# Mutation score",
        "",
        f"Written by `{command}` from `reports/raw/mutation.json`, which keeps each group's last run: "
        + "; ".join(f"`{c}` on {dt} (mutmut {mv}, Python {py}, {m})" for dt, c, mv, py, m in runs)
        + ". Modules: "
        + ", ".join(f"`{p}`" for p in cfg.get("source_paths", []))
        + "; tests: "
        + ", ".join(f"`{t}`" for t in cfg.get("pytest_add_cli_args_test_selection", []))
        + ". Lines that run only on CUDA carry `# pragma: no mutate` (the GPU tests run them).",
        "",
        f"**{killed} of {total} mutants killed ({100.0 * killed / max(1, total):.1f}%)**; of the mutants that change "
        f"behaviour (less {len(text)} that only reword a message and {len(why)} equivalent ones, listed below), "
        f"**{killed} of {behaviour} ({100.0 * killed / max(1, behaviour):.1f}%)**.",
        "",
        "| group | modules | run | mutants | killed | timeout | survived | no tests | score | text only | equivalent "
        "| behaviour score |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g, prefixes in GROUPS.items():
        mine = {n: s for n, s in statuses.items() if group_of(n) == g}
        if not mine:
            lines.append(f"| {g} | not run | | | | | | | | | | |")
            continue
        c = Counter(mine.values())
        k, t = sum(c.get(s, 0) for s in _DETECTED), len(mine)
        n_text, n_eq = sum(n in text for n in mine), sum(n in why for n in mine)
        mods = ", ".join(p.removeprefix("flashcheck.").rstrip(".") for p in prefixes)
        lines.append(
            f"| {g} | {mods} | {raw['groups'][g]['date']} | {t} | {c.get('killed', 0)} | {c.get('timeout', 0)} "
            f"| {c.get('survived', 0)} | {c.get('no tests', 0)} "
            f"| {100.0 * k / t:.1f}% | {n_text} | {n_eq} | {100.0 * k / max(1, t - n_text - n_eq):.1f}% |"
        )
    lines += [
        "",
        "A surviving mutant is a change to a check that no test notices; a test that pins the boundary or the field",
        "it changes kills it. `no tests`: no selected test reaches the function. `timeout`: the tests ran past",
        "30 times their usual CPU time under the mutant (mutmut's limit); they would hang the suite, so a timeout",
        "counts as killed, as mutmut counts it.",
        "",
        "## Surviving mutants that change behaviour",
        "",
    ]
    for name in survivors:
        if name not in text and name not in why:
            lines += [f"`{name}` ({statuses[name]})", "", "```diff", *d[name], "```", ""]
    lines += ["## Equivalent survivors", "", "| mutant | change | why it changes nothing observable |", "|---|---|---|"]
    for name in sorted(why):
        change = " / ".join(ln.replace("|", "\\|").strip() for ln in d[name] if ln.startswith("+"))[:100]
        lines.append(f"| `{name.split('.', 1)[1]}` | `{change or '(line removed)'}` | {why[name]} |")
    lines += ["", f"{len(text)} survivors only reword a message or a hint (no test pins prose):", ""]
    by_fn = Counter(n.rsplit("__mutmut_", 1)[0] for n in text)
    lines += [f"- `{fn}`: {n}" for fn, n in sorted(by_fn.items())]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-run", action="store_true", help="only write the report from reports/raw/mutation.json")
    p.add_argument(
        "--group", action="append", choices=sorted(GROUPS), help="run only this group's mutants (repeatable)"
    )
    p.add_argument("--max-children", default="2", help="parallel mutant runs (default 2)")
    a = p.parse_args()
    raw = load_raw()
    groups = a.group or list(GROUPS)
    run_command = "python benchmarks/mutation.py" + "".join(f" --group {g}" for g in a.group or [])
    if not a.no_run:
        names = [f"{prefix}*" for g in groups for prefix in GROUPS[g]] if a.group else []
        _mutmut("run", "--max-children", a.max_children, *names)
        statuses = results()
        if not statuses:
            print("no mutmut results (pip install mutmut)", file=sys.stderr)
            return 2
        record(raw, groups, statuses, run_command)
        RAW.write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    if not raw["groups"]:
        print("no raw results: run without --no-run first", file=sys.stderr)
        return 2
    command = "python benchmarks/mutation.py --no-run" if a.no_run else run_command
    REPORT.write_text(render(raw, command), encoding="utf-8")
    print(f"wrote {REPORT.relative_to(ROOT)} and {RAW.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
