"""``flashcheck workspace``: the worst-case FlashInfer workspace of an engine configuration, per wrapper and kind.

Exit codes: 0 every configured size covers its bound (or none was given), 1 shortfall findings (FC306), 2 a bad
configuration, flag or value (one line), 3 ``--confirm`` without a GPU or FlashInfer, 4 ``--confirm`` ran and the GPU
did not confirm a bound (a witness overflowed at the bound or ran one byte below its need).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from flashcheck.cli import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INCOMPLETE
from flashcheck.cli._common import add_out
from flashcheck.errors import InvalidArgument

# flag -> EngineConfig field (the values override the preset's or the file's)
_INT_FLAGS = {
    "--float-bytes": "float_bytes",
    "--int-bytes": "int_bytes",
    "--pinned-bytes": "pinned_bytes",
    "--num-qo-heads": "num_qo_heads",
    "--num-kv-heads": "num_kv_heads",
    "--head-dim": "head_dim_qk",
    "--page-size": "page_size",
    "--max-batch": "max_batch",
    "--max-tokens": "max_tokens",
    "--max-seq-len": "max_seq_len",
    "--spec-len": "spec_len",
    "--num-sms": "num_sms",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", metavar="NAME", default=None, help="a preset (--list-presets) or built-in target")
    src.add_argument("--config", metavar="FILE.toml", default=None, help="the engine configuration as TOML")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    for flag, dest in _INT_FLAGS.items():
        p.add_argument(flag, dest=dest, metavar="N", default=None, help=f"override {dest}")
    p.add_argument("--flashinfer", default=None, choices=["0.6.13", "0.7.2", "any"], help="planner rules")
    p.add_argument("--margin", type=float, default=None, help="recommended size = need x (1 + margin); 0.10")
    p.add_argument("--format", default="text", choices=["text", "json"], help="output format")
    p.add_argument("--verbose", "-v", action="store_true", help="every graph bucket, not only the largest")
    p.add_argument("--repro-dir", metavar="DIR", default=None, help="write each shortfall's witness reproducer")
    p.add_argument("--seed", type=int, default=0, help="seed of the random part of the search")
    p.add_argument("--confirm", action="store_true", help="also run every witness on this GPU under the arena")
    add_out(p, "write the report to this file instead of stdout")


def _int(flag: str, text: str) -> int:
    try:
        value = int(str(text).replace("_", ""), 0)
    except ValueError:
        raise InvalidArgument(f"{flag} must be an integer byte count or number, got {text!r}") from None
    return value


def load(args: argparse.Namespace) -> Any:
    from flashcheck.workspace import load_toml, preset

    if args.config:
        cfg = load_toml(args.config)
    elif args.preset:
        cfg = preset(args.preset)
    else:
        raise InvalidArgument("give --preset NAME or --config FILE.toml (flashcheck workspace --list-presets)")
    changes: dict[str, Any] = {}
    for flag, dest in _INT_FLAGS.items():
        raw = getattr(args, dest)
        if raw is not None:
            changes[dest] = _int(flag, raw)
    if "head_dim_qk" in changes:
        changes["head_dim_vo"] = changes["head_dim_qk"]
    if args.flashinfer is not None:
        changes["flashinfer"] = args.flashinfer
    if args.margin is not None:
        changes["margin"] = args.margin
    return cfg.replace(**changes) if changes else cfg


def run(args: argparse.Namespace) -> int:
    from flashcheck.workspace import preset_names, run_oracle
    from flashcheck.workspace.report import findings, render_json, render_text

    if args.list_presets:
        print("\n".join(preset_names()))
        return EXIT_CLEAN
    cfg = load(args)
    result = run_oracle(cfg, seed=args.seed)
    found = findings(result, Path(args.repro_dir) if args.repro_dir else None)
    records: list[dict[str, Any]] | None = None
    if args.confirm:
        from flashcheck.workspace.confirm import confirm_result

        records = confirm_result(result)
    if args.format == "json":
        text = render_json(result, found, records)
    else:
        text = render_text(result, found, verbose=args.verbose)
        if records is not None:
            from flashcheck.workspace.confirm import summarize

            text += summarize(records)
    if args.out:
        from flashcheck.findings import atomic_write_text

        atomic_write_text(Path(args.out), text)
    else:
        sys.stdout.write(text)
    if records is not None and any(r["status"] == "MISMATCH" for r in records):
        print("flashcheck workspace: the GPU did not confirm every bound (see MISMATCH above)", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_FINDINGS if found else EXIT_CLEAN
