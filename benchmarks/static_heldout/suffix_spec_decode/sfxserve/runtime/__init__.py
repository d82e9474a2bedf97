from sfxserve.runtime.engine import SuffixSpecEngine  # noqa: F401
