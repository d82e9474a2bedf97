"""sso: a small serving engine built from swappable State and Strategy objects."""

__version__ = "0.3.0"
