import enum

MAX_TREE_NODES = 64


class WsSize(enum.IntEnum):
    """Workspace sizes in bytes, picked when the trees were at most 32 nodes."""

    TREE = 192 * 1024 * 1024
