"""``flashcheck campaign``: a long fuzz campaign, one worker process per GPU, crash-isolated, resumable.

Examples::

    flashcheck campaign --target decode-tc --time 8h --workers auto --out runs/decode
    flashcheck campaign --resume runs/decode                  # after a kill -9: continues where it stopped
    flashcheck campaign --demo                                # short campaign on the default target
    flashcheck campaign --target mypkg.backend:MyTarget --steps 2000 --ledger quarantine.toml
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from flashcheck.cli._common import add_async_pressure, add_config, add_out, parse_json_object
from flashcheck.errors import EXIT_CLEAN, EXIT_INCOMPLETE, InvalidArgument
from flashcheck.pressure import parse_pressure_us

__all__ = ["add_arguments", "auto_targets", "run"]

DEMO_STEPS_CPU = 200
DEMO_TIME_GPU = "3m"
DEFAULT_TIME = "10m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("Examples::", 1)[1] if __doc__ else None
    g = p.add_argument_group("what and how long")
    g.add_argument(
        "--target",
        help="target spec(s), comma-separated: a built-in name, module:ClassName, or "
        "'auto' (the FlashInfer targets when a GPU and FlashInfer are present, else cpu-reference)",
    )
    g.add_argument(
        "--demo",
        action="store_true",
        help=f"a short campaign on --target auto ({DEMO_TIME_GPU} on "
        f"GPU, {DEMO_STEPS_CPU} steps on CPU) ending with the summary; what the README's main job runs",
    )
    g.add_argument("--time", help=f"time budget, e.g. 90s, 10m, 8h, 1h30m (default {DEFAULT_TIME} unless --steps)")
    g.add_argument("--steps", type=int, help="step budget (all workers of this node together)")
    g.add_argument("--seed", type=int, help="campaign seed (default: random, printed in the header)")
    g.add_argument("--select", help="comma-separated check IDs to report (default all; FC251 is always reported)")
    add_config(g)
    g = p.add_argument_group("where and with what")
    add_out(g, "run directory (default runs/campaign-YYYYmmdd-HHMMSS)", metavar="DIR")
    g.add_argument(
        "--resume", metavar="DIR", help="continue the campaign in DIR (optionally with a new --time/--steps)"
    )
    g.add_argument("--workers", help="worker processes: 'auto' (one per visible GPU, 1 on CPU) or N")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), help="device of the workers (default auto)")
    g.add_argument("--layers", choices=("off", "cheap", "all", "races"), help="runtime detection layers (default all)")
    add_async_pressure(g)
    g.add_argument("--ledger", help="quarantine ledger (JSON or TOML): known crashers skipped before launch")
    g.add_argument("--corpus", help="corpus: a (shared) directory or redis://host:port/db (default RUN_DIR/corpus)")
    g.add_argument("--chunk-steps", type=int, help="steps per scenario chunk, the unit of durability (default 50)")
    g.add_argument("--step-timeout", help="a step that takes longer is hung (default 10m)")
    g.add_argument(
        "--warm-up-scale",
        type=float,
        help="the first eager and capture step (and a first replay before any capture) of each worker may take "
        "this many step timeouts (default 5: first-use JIT compiles; 1 with kernels compiled ahead of time)",
    )
    g = p.add_argument_group("several machines (see docs/campaigns.md)")
    g.add_argument(
        "--node-index",
        type=int,
        help="this node's index (default: SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX or FLASHCHECK_NODE_INDEX, else 0)",
    )
    g.add_argument(
        "--num-nodes",
        type=int,
        help="number of nodes (default: SLURM_ARRAY_TASK_COUNT or FLASHCHECK_NUM_NODES, else 1)",
    )
    g = p.add_argument_group("display")
    g.add_argument(
        "--log-every",
        type=float,
        default=30.0,
        help="seconds between progress lines when stdout is not a terminal (default 30)",
    )


def auto_targets() -> tuple[str, ...]:
    """The FlashInfer built-ins when a GPU and FlashInfer are present, the CPU reference target otherwise."""
    from flashcheck.campaign.options import count_gpus
    from flashcheck.targets.registry import GPU_TARGETS

    if count_gpus() > 0 and importlib.util.find_spec("flashinfer") is not None:
        return GPU_TARGETS
    return ("cpu-reference",)


def _targets(text: str) -> tuple[str, ...]:
    from flashcheck.targets.registry import resolve_target

    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise InvalidArgument("--target is empty; name a built-in target, module:ClassName, or auto")
    if names == ("auto",):
        return auto_targets()
    for n in names:
        resolve_target(n)  # unknown names fail here, before anything starts
    return names


def _positive(value: int | None, flag: str) -> int | None:
    if value is not None and value < 1:
        raise InvalidArgument(f"{flag} {value}: give a positive number")
    return value


def _construct(targets: tuple[str, ...], config: dict[str, Any]) -> list[str]:
    """Build each target once here (not set up: no GPU work), so that a bad name, module or configuration key
    fails now with one line, before any worker starts or the run directory is created."""
    from flashcheck.targets.registry import make_target

    return [make_target(t, **config).name for t in targets]


def _select(text: str | None) -> tuple[str, ...]:
    from flashcheck.catalogue import get_check

    if not text:
        return ()
    return tuple(get_check(x).id for x in text.split(",") if x.strip())


def _new_config(args: argparse.Namespace) -> Any:
    from flashcheck.campaign.options import (
        CampaignConfig,
        parse_duration,
        parse_workers,
        resolve_node,
        visible_gpu_ids,
    )

    targets = _targets(args.target or ("auto" if args.demo else "")) if (args.target or args.demo) else None
    if targets is None:
        raise InvalidArgument("name a --target (a built-in, module:ClassName or auto), or use --demo or --resume")
    on_gpu = any(t != "cpu-reference" for t in targets) or args.device == "cuda"
    time_s = parse_duration(args.time) if args.time else None
    steps = _positive(args.steps, "--steps")
    chunk = _positive(args.chunk_steps, "--chunk-steps")
    if time_s is None and steps is None:
        if args.demo:
            time_s, steps = (parse_duration(DEMO_TIME_GPU), None) if on_gpu else (None, DEMO_STEPS_CPU)
        else:
            time_s = parse_duration(DEFAULT_TIME)
    gpus = visible_gpu_ids() if args.device != "cpu" else []
    node, nodes = resolve_node(args.node_index, args.num_nodes)
    tcfg = parse_json_object(args.config, "--config")
    _construct(targets, tcfg)
    if args.ledger:
        from flashcheck.campaign.ledger import load_ledger

        load_ledger(args.ledger)  # a bad ledger fails now, not in every worker
    return CampaignConfig(
        targets=targets,
        seed=args.seed if args.seed is not None else int.from_bytes(__import__("os").urandom(4), "little"),
        workers=parse_workers(args.workers or "auto", len(gpus)),
        time_budget=time_s,
        step_budget=steps,
        chunk_steps=chunk or 50,
        layers=args.layers or "all",
        device=args.device or "auto",
        step_timeout=parse_duration(args.step_timeout, "--step-timeout") if args.step_timeout else 600.0,
        warm_up_scale=args.warm_up_scale if args.warm_up_scale is not None else 5.0,
        node_index=node,
        num_nodes=nodes,
        gpus=tuple(gpus),
        select=_select(args.select),
        ledger=str(Path(args.ledger).resolve()) if args.ledger else None,
        corpus=args.corpus,
        target_config=tcfg,
        async_pressure_us=parse_pressure_us(args.async_pressure_us),
    )


_FIXED_ON_RESUME = (
    "target",
    "demo",
    "seed",
    "select",
    "config",
    "workers",
    "device",
    "layers",
    "async_pressure_us",
    "ledger",
    "corpus",
    "chunk_steps",
    "node_index",
    "num_nodes",
    "out",
)


def run(args: argparse.Namespace) -> int:
    from flashcheck.cli._common import require_runtime

    require_runtime("campaign")
    import dataclasses

    from flashcheck.campaign.checks import campaign_checks
    from flashcheck.campaign.corpus import Corpus, open_database
    from flashcheck.campaign.options import CampaignConfig, format_duration, parse_duration
    from flashcheck.campaign.progress import Progress, final_report
    from flashcheck.campaign.store import CampaignStore, load_campaign_meta
    from flashcheck.campaign.supervisor import Supervisor

    command = "flashcheck " + " ".join(shlex.quote(a) for a in getattr(args, "argv", sys.argv[1:]))
    corpus_db = None
    if args.resume:
        given = [f"--{k.replace('_', '-')}" for k in _FIXED_ON_RESUME if getattr(args, k, None)]
        if given:
            raise InvalidArgument(
                f"--resume continues a campaign with its own settings; drop {', '.join(given)} "
                "(only --time, --steps and --step-timeout may change)"
            )
        run_dir = Path(args.resume)
        meta = load_campaign_meta(run_dir)
        cfg = CampaignConfig.from_dict(meta["campaign"]["config"])
        if args.time or args.steps:
            cfg = dataclasses.replace(
                cfg,
                time_budget=parse_duration(args.time) if args.time else None,
                step_budget=_positive(args.steps, "--steps"),
            )
        if args.step_timeout:
            cfg = dataclasses.replace(cfg, step_timeout=parse_duration(args.step_timeout, "--step-timeout"))
        store = CampaignStore.resume(run_dir)
        store.meta["campaign"]["config"] = cfg.to_dict()
    else:
        cfg = _new_config(args)
        run_dir = Path(args.out or time.strftime("runs/campaign-%Y%m%d-%H%M%S"))
        meta = {
            "kind": "campaign",
            "command": command,
            "seed": cfg.seed,
            "target": ",".join(cfg.targets),
            "targets": _construct(cfg.targets, dict(cfg.target_config)),
            "checks": campaign_checks(cfg.layers, cfg.select, cuda=bool(cfg.gpus) and cfg.device != "cpu"),
            "campaign": {"config": cfg.to_dict(), "workers": {}},
        }
        corpus_db = open_database(cfg.corpus, run_dir) if cfg.corpus else None  # a bad backend fails before --out
        store = CampaignStore.create(run_dir, meta)
    corpus = Corpus(corpus_db or open_database(cfg.corpus, run_dir))
    budget = " + ".join(
        x
        for x in (
            format_duration(cfg.time_budget) if cfg.time_budget else "",
            f"{cfg.step_budget} steps" if cfg.step_budget else "",
        )
        if x
    )
    print(
        f"flashcheck campaign: seed={cfg.seed} targets={','.join(cfg.targets)} workers={cfg.workers} "
        f"budget={budget} node={cfg.node_index}/{cfg.num_nodes} out={run_dir}"
        + (f" (resumed, session {store.sessions}, {store.steps_done()} steps done)" if args.resume else ""),
        flush=True,
    )
    progress = Progress(sys.stdout, log_every=args.log_every)
    outcome = Supervisor(cfg, store, corpus, progress).run()
    print(final_report(run_dir), end="", flush=True)
    print(
        f"campaign stopped: {outcome.reason}; run directory {run_dir} (resume with "
        f"flashcheck campaign --resume {run_dir})",
        flush=True,
    )
    if outcome.code in (2, 3, 5):
        print(f"flashcheck campaign: {outcome.reason}", file=sys.stderr)
    if outcome.code == EXIT_CLEAN:  # no finding; clean only as every report reads it (each selected check exercised)
        from flashcheck.reports import build_view
        from flashcheck.rundir import load_run

        view = build_view(load_run(run_dir))
        if view.verdict() == "incomplete":
            print(f"flashcheck campaign: incomplete: {'; '.join(view.incomplete_reasons())}", file=sys.stderr)
            return EXIT_INCOMPLETE
    return outcome.code
