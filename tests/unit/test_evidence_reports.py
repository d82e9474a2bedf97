"""The evidence pages are generated from reports/raw: re-rendering them from the committed raw results changes
nothing (no figure in them is typed by hand), and a raw file that changes shows up in its page."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

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


def test_the_environment_names_flashinfers_requirements_that_are_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types
    from importlib import metadata

    from flashcheck.rundir import environment

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="0.7.2.post1"))
    requires = {"flashinfer-python": ["numpy", "nvidia-cudnn-frontend>=1.31.0", 'torch>=2.12.0; extra == "b12x"']}
    installed = {"numpy": "2.0"}

    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(metadata, "requires", lambda dist: requires[dist])
    monkeypatch.setattr(metadata, "version", version)
    env = environment()
    assert env["flashinfer_missing"] == ["nvidia-cudnn-frontend"]
    line = _load("render_evidence")._env_line(env, "2026-11-27")
    assert line.endswith("FlashInfer's requirements not installed: nvidia-cudnn-frontend")
    installed["nvidia-cudnn-frontend"] = "1.32.0"
    assert "flashinfer_missing" not in environment()


def test_a_benchmarks_environment_probes_torch_and_flashinfer_a_runs_reports_only_what_it_imported(
    tmp_path: Path,
) -> None:
    import os
    import subprocess
    import sys

    fake = tmp_path / "flashinfer"  # an importable FlashInfer stand-in: its version must show up only when probed
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.0.fake"\n')
    code = (
        "import json; from flashcheck.rundir import environment; "
        "plain = environment(); probed = environment(probe=True); keys = ('torch', 'flashinfer'); "
        "print(json.dumps([plain.get(k) for k in keys] + [probed.get(k) for k in keys]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    plain_torch, plain_fi, probed_torch, probed_fi = json.loads(out)
    assert (plain_torch, plain_fi) == (None, None)  # `import flashcheck` imports neither
    assert probed_torch is not None and probed_fi == "0.0.fake"


def test_throughput_rounds_give_the_median_round_beside_the_spread_and_the_overall_rate() -> None:
    """A mode run in rounds reads as its median round (a slow spell of the host in one round does not set it),
    with its slowest and fastest round and its rate over all rounds on the page; means are over every step."""
    mod = _load("fuzz_throughput")
    runs = [
        {
            "mode": "driver",
            "steps": s,
            "seconds": t,
            "per_second": s / t,
            "findings": f,
            "mean_batch": b,
            "mean_kv_tokens": 10.0,
        }
        for s, t, f, b in [(100, 1.0, 0, 1.0), (600, 2.0, 1, 2.0), (200, 1.0, 0, 4.0)]
    ]
    row = mod._over_rounds(runs)
    assert row["per_second"] == 200.0 and row["rounds"] == [100.0, 300.0, 200.0]
    assert row["overall_per_second"] == 225.0 and row["steps"] == 900 and row["findings"] == 1
    assert row["mean_batch"] == pytest.approx((100 * 1 + 600 * 2 + 200 * 4) / 900)
    row["mode"], row["vs_given"] = "driver, layers all", 2.0
    page = "\n".join(
        _load("render_evidence")._throughput(Path("fuzz_throughput-x.json"), {"rounds": 3, "results": [row]})
    )
    assert "| driver, layers all | 200.0 | 100.0 – 300.0 | 225.0 |" in page and "3 rounds of" in page
