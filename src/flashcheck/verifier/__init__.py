"""The static verifier (``flashcheck static``): FC1xx rules over an intra-project call graph, without a GPU.

Public surface: `check_paths` runs the rules over files and directories with a `StaticConfig` (see `load_config`
for ``[tool.flashcheck.static]``); its results render through `flashcheck.reports` like every run.
"""

from __future__ import annotations

from flashcheck.verifier.config import StaticConfig, load_config
from flashcheck.verifier.engine import StaticResult, check_paths

__all__ = ["StaticConfig", "StaticResult", "check_paths", "load_config"]
