from diffserve.runner.model_runner import DiffModelRunner, StepInput

__all__ = ["DiffModelRunner", "StepInput"]
