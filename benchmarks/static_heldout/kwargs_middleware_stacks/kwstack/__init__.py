"""kwstack: a small SGLang-shaped decode engine built around forwarding middleware stacks."""

__version__ = "0.3.0"
