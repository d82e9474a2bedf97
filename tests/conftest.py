"""Shared test configuration: Hypothesis profiles sized for 2-core CI, and the slow tests first."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# One OpenMP thread in this process and in every process a test starts (campaign and isolated workers, the CLI):
# the CPU targets run tiny ops, and on a busy 2-core host each torch process's spinning thread pool steals the cores
# the others need (a campaign test ran 10x slower beside the rest of the suite). Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# No example database: a test takes the same time in a fresh clone, in CI (where Hypothesis turns the database off
# itself) and here. With one, a planted-bug run replays its saved failure at once from the second run on, and a
# suite that is slow in CI looks fast on a developer's machine.
settings.register_profile(
    "ci", max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# The cupti layer compiles its C filter on first use: into the test run's own directory, never the user's cache, and
# removed at the end of the process.
if "FLASHCHECK_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="flashcheck-test-cache-")
    os.environ["FLASHCHECK_CACHE_DIR"] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
# `flashcheck static` keeps its summary cache next to the project's configuration, or in the current directory
# (here, the checkout) when there is none: tests that run the command use one of their own, removed at the end.
if "FLASHCHECK_STATIC_CACHE_DIR" not in os.environ:
    _STATIC_CACHE = tempfile.mkdtemp(prefix="flashcheck-test-static-cache-")
    os.environ["FLASHCHECK_STATIC_CACHE_DIR"] = _STATIC_CACHE
    atexit.register(shutil.rmtree, _STATIC_CACHE, ignore_errors=True)

if "mutmut" in sys.modules:  # under `python benchmarks/mutation.py`
    # mutmut wraps every mutated function in a trampoline that lives in its own package: a frame of flashcheck's,
    # as far as the user's line goes, so a finding points where it would without mutmut.
    import mutmut

    from flashcheck.runtime import stacks

    _MUTMUT_DIR = os.path.dirname(os.path.abspath(mutmut.__file__)) + os.sep
    _is_internal = stacks.is_internal_file
    stacks.is_internal_file = lambda path: path.startswith(_MUTMUT_DIR) or _is_internal(path)


# Tests that share `stale_last_page_len_failure` carry this group: under --dist loadgroup they run on one worker,
# which runs the fuzz once.
STALE_LAST_PAGE_LEN = pytest.mark.xdist_group("stale_last_page_len")
# The detection layers of fuzz runs that must find a planted property bug (FC30x): none. No layer takes part in
# finding or shrinking it, and on 2 CPU cores the layers take a third to a half of such a run's time. The runs
# over the clean target keep them ("all"), so that a layer's false positive still fails the suite.
PLANTED_BUG_LAYERS = "off"


def fuzz_planted_bug(target: Any, log_dir: Path) -> Any:
    """The `FuzzFailure` of the fuzz run every planted-bug test makes (seed 1, 60 examples, shrunk, CPU, no
    detection layers), its reproducers written into `log_dir`."""
    from flashcheck.fuzzing.recorder import FindingLog
    from flashcheck.fuzzing.stateful import FuzzFailure, fuzz_target

    with pytest.raises(FuzzFailure) as info:
        fuzz_target(
            target,
            budget=60,
            seed=1,
            profile="ci",
            device="cpu",
            layers=PLANTED_BUG_LAYERS,
            database=None,
            log=FindingLog(log_dir),
        )
    return info.value


@pytest.fixture(scope="session")
def stale_last_page_len_failure(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The `FuzzFailure` of one fuzz run of the planted stale-kv_last_page_len bug (seed 1, 60 examples, shrunk),
    its reproducers written into their own directory (``exc.log_dir``): tests/quality checks what the run found
    and how far it shrank, tests/fuzz/test_repro_replay.py replays the reproducer it left. No detection layers
    (`PLANTED_BUG_LAYERS`): FC303 is a property."""
    quality = str(Path(__file__).resolve().parent / "quality")
    if quality not in sys.path:
        sys.path.insert(0, quality)
    import faulty_targets

    out = tmp_path_factory.mktemp("stale-last-page-len")
    small = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}
    exc = fuzz_planted_bug(faulty_targets.StaleLastPageLen(**small), out)
    exc.log_dir = out
    return exc


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, which names the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first: in a parallel run (``-n``) the long ones start at once on every worker
    instead of leaving one worker busy at the end (the order is otherwise kept). Under ``--dist loadgroup`` every
    test marked ``xdist_group`` carries its group in its node ID, which is what keeps a group on one worker."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if getattr(config.option, "loadgroup", False):
        for item in items:
            _name_group(item)


def _name_group(item: pytest.Item) -> None:
    """pytest-xdist 3.8 appends ``@group`` to ``item._nodeid``, which pytest 9.2 no longer reads (the ID lives in
    ``item._id``): the group's tests were spread over the workers and each ran its module-scoped setup
    (pytest-dev/pytest-xdist#1386). Append it where the ID now lives; a no-op where xdist's suffix took."""
    names = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    node_id = getattr(item, "_id", None)
    if not names or node_id is None or "@" in item.nodeid.rpartition("]")[2]:
        return
    item._id = type(node_id).parse(f"{item.nodeid}@{'_'.join(names)}")
