import enum

MAX_LORAS = 16
MAX_LORA_RANK = 64
assert MAX_LORA_RANK % 8 == 0, "punica kernels need rank % 8 == 0"  # ok: FC109


class WsSize(enum.IntEnum):
    """Workspace sizes in bytes."""

    DECODE = 128 << 20
    PREFIX = 64 << 20


class AdapterKind(enum.Enum):
    LORA = "lora"
    PREFIX_TUNING = "prefix"
