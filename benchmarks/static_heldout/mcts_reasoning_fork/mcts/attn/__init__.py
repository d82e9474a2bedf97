from mcts.attn.expand_backend import ChildRow, ExpansionAttnBackend

__all__ = ["ChildRow", "ExpansionAttnBackend"]
