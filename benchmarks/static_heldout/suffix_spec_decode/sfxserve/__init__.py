"""sfxserve: a speculative decoding server whose drafts come from suffix trees, not a draft model."""

__version__ = "0.3.1"
