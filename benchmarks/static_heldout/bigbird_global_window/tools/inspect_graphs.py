"""Ops tool: build an engine, capture its graphs and dump what each bucket reads.

    python -m tools.inspect_graphs --bs 8 16
"""
from __future__ import annotations

import argparse

from bbserve.config import EngineConfig
from bbserve.engine.engine import SparseEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    engine = SparseEngine(EngineConfig())
    engine.runner.capture_all()
    for bs in args.bs:
        engine.runner.replay_debug_dump(engine.runner.bucket(bs))
    print(engine.backend.window_graph[engine.runner.bucket(args.bs[0])].window())


if __name__ == "__main__":
    main()
