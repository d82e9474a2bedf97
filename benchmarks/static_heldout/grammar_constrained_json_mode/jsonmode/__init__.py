"""JSON mode: a token-level grammar automaton and the allowed-token bitmasks it produces."""
from .automaton import JsonAutomaton, JsonState, RequestGrammar
from .bitmask import BitmaskBuilder, GrammarDeadEnd
from .config import JsonModeConfig
from .vocab import TokenClass, TokenClassTable

__all__ = [
    "JsonAutomaton",
    "JsonState",
    "RequestGrammar",
    "BitmaskBuilder",
    "GrammarDeadEnd",
    "JsonModeConfig",
    "TokenClass",
    "TokenClassTable",
]
