"""What ``flashcheck static`` reports on the sources of real open-source serving engines, at pinned commits.

Each engine in `ENGINES` is checked as a first run would check it: its package folder, the default hot-path roots,
no configuration, no cache. The Python files of the pinned commit are exported from a local clone of the engine
(``--repo NAME=GIT_DIR``: a clone or a bare mirror that holds the commit; ``git archive`` of the ``*.py`` files, so
the commit is verified and nothing else of the checkout matters). The findings are matched with the committed
triage (``benchmarks/static_engines.toml``: per finding site and rule, ``bug`` where the rule's condition holds there
and the code breaks what the rule's page says, ``false-positive`` where it does not, with the reason), so the report
gives the precision on the labelled findings and how many are not labelled; FC109's findings are counted apart
(``assert`` on arguments is a style rule, and engines have hundreds). ``--before REV`` runs the verifier of commit
REV of this repository on the same exports in the same run (its ``src/`` unpacked with ``git archive``), so a
change shows as findings gone and new. Writes ``reports/raw/static_engines.json`` and ``reports/static-engines.md``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/static_engines.py --repo rtp-llm=/path/to/rtp-llm \\
        --repo lightllm=... --repo text-generation-inference=... --repo lorax=... --repo aphrodite-engine=... \\
        --repo ktransformers=... --repo mini-sglang=... --repo sarathi-serve=... --repo tokasaurus=... \\
        --repo chitu=... [--before REV]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TRIAGE = Path(__file__).with_suffix(".toml")


@dataclass(frozen=True)
class Engine:
    repo: str  # owner/name on GitHub
    commit: str
    paths: tuple[str, ...]  # what is checked, relative to the repository root


ENGINES: dict[str, Engine] = {
    "rtp-llm": Engine("alibaba/rtp-llm", "4b8d39cd5cbe4eff0cf0661411e15be21ccc58b9", ("rtp_llm",)),
    "lightllm": Engine("ModelTC/lightllm", "fc72ffab9a3455cfb571f22d45ab777cc29de0de", ("lightllm",)),
    "text-generation-inference": Engine(
        "huggingface/text-generation-inference",
        "db931fcf42da018a3657580c64bf2720f167f9ab",
        ("server/text_generation_server",),
    ),
    "lorax": Engine("predibase/lorax", "a7394ba386ece427d5a6125b419aa38b46d966dc", ("server/lorax_server",)),
    "aphrodite-engine": Engine(
        "aphrodite-engine/aphrodite-engine", "b42eeec22c42d9a485bab4a8784b26abccf44515", ("aphrodite",)
    ),
    # the last commit with ktransformers' own serving package (later ones serve through SGLang)
    "ktransformers": Engine("kvcache-ai/ktransformers", "8729435d85e75bb63e4a794b5a233e2a29229893", ("ktransformers",)),
    "mini-sglang": Engine("sgl-project/mini-sglang", "20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66", ("python/minisgl",)),
    "sarathi-serve": Engine("microsoft/sarathi-serve", "96f9911790ecc00af12ee9fae47cb8fa9ba0d199", ("sarathi",)),
    "tokasaurus": Engine("ScalingIntelligence/tokasaurus", "726890525a97f6ab156224f60f1e75e4f0db1f59", ("tokasaurus",)),
    "chitu": Engine("thu-pacman/chitu", "6261b7a06d348b865154dab5d018168bd92e75da", ("chitu",)),
}
_VERDICTS = ("bug", "false-positive")
_CHILD = """
import json, sys
from flashcheck.verifier import StaticConfig, check_paths
root, paths = sys.argv[1], sys.argv[2:]
r = check_paths(paths, StaticConfig(root=root, jobs=1))
print(json.dumps({"files": len(r.files), "lines": r.lines, "roots": r.roots, "errors": len(r.internal_errors),
                  "findings": [{"id": f.id, "site": f"{f.location.file}:{f.location.line}",
                                "confidence": f.confidence.value, "message": f.message} for f in r.findings]}))
"""


def export(git_dir: str, engine: Engine, dest: Path) -> None:
    """The ``*.py`` files of the engine's commit, from `git_dir`, into `dest`."""
    names = subprocess.run(
        ["git", "--git-dir", _git_dir(git_dir), "ls-tree", "-r", "--name-only", engine.commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    wanted = [n for n in names if n.endswith(".py") and n.startswith(tuple(p + "/" for p in engine.paths))]
    if not wanted:
        raise SystemExit(f"{engine.repo}@{engine.commit}: no Python files under {', '.join(engine.paths)}")
    tar = subprocess.run(
        ["git", "--git-dir", _git_dir(git_dir), "archive", engine.commit, "--", *wanted],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar.stdout, check=True)


def _git_dir(path: str) -> str:
    p = Path(path)
    return str(p / ".git") if (p / ".git").exists() else str(p)


def check(src: str, root: Path, engine: Engine) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), *(str(root / p) for p in engine.paths)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    doc["seconds"] = round(time.perf_counter() - t0, 2)
    return doc


def load_triage() -> dict[tuple[str, str, str], dict[str, str]]:
    doc = tomllib.loads(TRIAGE.read_text(encoding="utf-8"))
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for entry in doc.get("finding", []):
        key = (entry["engine"], entry["rule"], entry["site"])
        if entry["engine"] not in ENGINES or entry["verdict"] not in _VERDICTS or key in out:
            raise SystemExit(f"{TRIAGE.name}: bad or repeated entry {entry}; engines: {', '.join(ENGINES)}")
        out[key] = {"verdict": entry["verdict"], "why": entry["why"]}
    return out


def summarise(name: str, run: dict[str, Any], triage: dict[tuple[str, str, str], dict[str, str]]) -> dict[str, Any]:
    found = run["findings"]
    labelled = [dict(f, **triage[(name, f["id"], f["site"])]) for f in found if (name, f["id"], f["site"]) in triage]
    verdicts = Counter(f["verdict"] for f in labelled)
    others = [f for f in found if f["id"] != "FC109"]
    return {
        "per_rule": dict(sorted(Counter(f["id"] for f in found).items())),
        "labelled": labelled,
        "bugs": verdicts["bug"],
        "false_positives": verdicts["false-positive"],
        "unlabelled": sum(1 for f in others if (name, f["id"], f["site"]) not in triage),
        "stale_labels": sorted(
            f"{r} {s}" for (e, r, s) in triage if e == name and not any(f["id"] == r and f["site"] == s for f in found)
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", action="append", default=[], metavar="NAME=GIT_DIR", help="a clone of an engine")
    ap.add_argument("--before", metavar="REV", help="a commit of this repository whose verifier runs alongside")
    ap.add_argument("--json", default=str(ROOT / "reports" / "raw" / "static_engines.json"))
    ap.add_argument("--md", default=str(ROOT / "reports" / "static-engines.md"))
    args = ap.parse_args(argv)
    repos = dict(r.split("=", 1) for r in args.repo if "=" in r)
    unknown = sorted(set(repos) - set(ENGINES)) + [r for r in args.repo if "=" not in r]
    if unknown or not repos:
        ap.error(f"--repo NAME=GIT_DIR for each engine to check (known: {', '.join(ENGINES)}); got {unknown or 'none'}")
    triage = load_triage()
    command = "python benchmarks/static_engines.py " + " ".join(f"--repo {n}=<clone>" for n in repos)
    doc: dict[str, Any] = {
        "benchmark": "static_engines",
        "command": command + (f" --before {args.before}" if args.before else ""),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source_commit": _rev("HEAD"),
        "before": _rev(args.before) if args.before else None,
        "python": platform.python_version(),
        "engines": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        before_src = None
        if args.before:
            before_src = Path(tmp) / "before"
            before_src.mkdir()
            tar = subprocess.run(["git", "archive", args.before, "src"], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(before_src)], input=tar.stdout, check=True)
        for name, git_dir in repos.items():
            engine = ENGINES[name]
            dest = Path(tmp) / name
            dest.mkdir()
            export(git_dir, engine, dest)
            now = check(str(ROOT / "src"), dest, engine)
            entry: dict[str, Any] = {"repo": engine.repo, "commit": engine.commit, "paths": list(engine.paths)}
            entry.update({k: now[k] for k in ("files", "lines", "roots", "errors", "seconds")})
            entry.update(summarise(name, now, triage))
            entry["findings"] = [f for f in now["findings"] if f["id"] != "FC109"]  # FC109's: counted in per_rule
            if before_src is not None:
                then = check(str(before_src / "src"), dest, engine)
                old = {(f["id"], f["site"]) for f in then["findings"]}
                new = {(f["id"], f["site"]) for f in now["findings"]}
                entry["before"] = {
                    "seconds": then["seconds"],
                    "errors": then["errors"],
                    "per_rule": dict(sorted(Counter(f["id"] for f in then["findings"]).items())),
                    "gone": sorted(f"{r} {s}" for r, s in old - new),
                    "new": sorted(f"{r} {s}" for r, s in new - old),
                }
            doc["engines"][name] = entry
            print(
                f"{name}: {len(now['findings'])} findings, {entry['bugs']} bugs, {entry['false_positives']} false "
                f"positives, {entry['unlabelled']} unlabelled (FC109 apart)"
            )
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    Path(args.md).write_text(render(doc), encoding="utf-8")
    return 0


def _rev(rev: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()


def render(doc: dict[str, Any]) -> str:
    engines = doc["engines"]
    bugs = sum(e["bugs"] for e in engines.values())
    fps = sum(e["false_positives"] for e in engines.values())
    lines = [
        "# Static findings on real engines",
        "",
        f"Generated by `{doc['command']}` on {doc['date']} (flashcheck {doc['source_commit']}, Python "
        f"{doc['python']}). Each engine's package at the pinned commit, the default hot-path roots, no configuration. "
        "A labelled finding is `bug` where the rule's condition holds at that site and the code does what the rule's "
        "page says breaks serving, `false-positive` where it does not (`benchmarks/static_engines.toml` gives each "
        "reason); FC109 (`assert` on arguments) is counted apart.",
        "",
        f"Labelled findings over all engines: {bugs} bugs, {fps} false positives"
        + (f" (precision {bugs / (bugs + fps):.0%})" if bugs + fps else "")
        + f"; not labelled: {sum(e['unlabelled'] for e in engines.values())}.",
        "",
        "| engine | commit | files | lines | s | roots | internal errors | findings by rule | bugs | false positives | "
        "not labelled |" + (" findings by rule before | gone | new |" if doc["before"] else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if doc["before"] else ""),
    ]
    for name, e in engines.items():
        row = (
            f"| {name} | [{e['commit'][:10]}](https://github.com/{e['repo']}/tree/{e['commit']}) | {e['files']} | "
            f"{e['lines']} | {e['seconds']} | {e['roots']} | {e['errors']} | {_rules(e['per_rule'])} | {e['bugs']} | "
            f"{e['false_positives']} | {e['unlabelled']} |"
        )
        if doc["before"]:
            b = e["before"]
            row += f" {_rules(b['per_rule'])} | {len(b['gone'])} | {len(b['new'])} |"
        lines.append(row)
    if doc["before"]:
        lines += ["", f"Before is the verifier of {doc['before']}, run on the same exports in the same run."]
    lines += ["", "## Labelled findings", "", "| engine | rule | site | verdict | why |", "|---|---|---|---|---|"]
    for name, e in engines.items():
        for f in e["labelled"]:
            lines.append(f"| {name} | {f['id']} | `{f['site']}` | {f['verdict']} | {f['why']} |")
    failed = [name for name, e in engines.items() if e["errors"] or e.get("before", {}).get("errors")]
    if failed:  # a rule that crashed did not check the engine: its counts are not a clean result
        lines += ["", f"**Incomplete:** internal errors in {', '.join(failed)}; their findings are partial."]
    stale = [f"{name}: {s}" for name, e in engines.items() for s in e["stale_labels"]]
    if stale:
        lines += ["", "Labels that matched no finding in this run: " + "; ".join(stale) + "."]
    return "\n".join(lines) + "\n"


def _rules(per_rule: dict[str, int]) -> str:
    return ", ".join(f"{r} {n}" for r, n in per_rule.items()) or "none"


if __name__ == "__main__":
    raise SystemExit(main())
