"""Attention backends.

Backends are never imported from here: ``GPUModelRunner`` imports ``EngineConfig.backend_module`` and looks the
class up by ``EngineConfig.backend_cls``; a backend names its metadata builder and its impl by qualified name.
"""
