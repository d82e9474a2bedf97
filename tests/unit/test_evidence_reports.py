"""The evidence pages are generated from reports/raw: re-rendering them from the committed raw results changes
nothing (no figure in them is typed by hand), and a raw file that changes shows up in its page."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_verdicts_report_regenerates_from_raw_results() -> None:
    mod = _load("verdicts")
    assert mod.render(ROOT / "reports" / "raw") == (ROOT / "reports" / "verdicts.md").read_text()


def test_gpu_evidence_regenerates_from_raw_results(tmp_path: Path) -> None:
    mod = _load("render_evidence")
    assert mod.render(ROOT / "reports" / "raw") == (ROOT / "reports" / "gpu-evidence.md").read_text()
    # the page follows the files: a seed bug that is no longer found reads as not found
    raw = tmp_path / "raw"
    shutil.copytree(ROOT / "reports" / "raw", raw)
    path = raw / "seed_bugs-0.6.13.json"
    doc = json.loads(path.read_text())
    doc["results"][0]["found"] = False
    path.write_text(json.dumps(doc))
    assert f"| {doc['results'][0]['target']} | {doc['results'][0]['property']} | **no**" in mod.render(raw)
