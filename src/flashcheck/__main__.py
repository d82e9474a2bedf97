"""``python -m flashcheck``."""

from flashcheck.cli import main

raise SystemExit(main())
