"""Backend registry: each platform module registers its attention backend; the worker picks one at start-up."""
import importlib
import importlib.util
import os

_REGISTRY: dict = {}
_DEFAULT_PLATFORM = os.environ.get("XPU_PLATFORM", "auto")
assert _DEFAULT_PLATFORM in ("auto", "cuda", "ascend")  # ok: FC109


def register_backend(name: str):
    assert name not in _REGISTRY, f"backend {name} registered twice"  # expect: FC109

    def wrap(cls):
        _REGISTRY[name] = cls
        return cls

    return wrap


def detect_platform() -> str:
    if _DEFAULT_PLATFORM != "auto":
        return _DEFAULT_PLATFORM
    return "ascend" if importlib.util.find_spec("torch_npu") is not None else "cuda"


def get_backend_cls(platform: str):
    importlib.import_module(f"xpuserve.platforms.{'ascend' if platform == 'ascend' else 'cuda_flashinfer'}")
    return _REGISTRY[platform]
