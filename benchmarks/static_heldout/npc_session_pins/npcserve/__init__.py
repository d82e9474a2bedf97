"""npcserve: a dialogue server for game NPCs.

Thousands of tiny sessions (one per player/NPC conversation) share a handful of persona prompts.
A persona is prefilled once per NPC archetype and its pages stay pinned while any session of that
NPC is open; each session owns a few dialogue pages on top of them.
"""

from npcserve.config import NPCServerConfig

__all__ = ["NPCServerConfig"]
