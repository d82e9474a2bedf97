"""Offline tools for designers: dump what an NPC 'felt' during a conversation."""
from __future__ import annotations

import json

import torch

EMOTE_NAMES = ["neutral", "happy", "angry", "afraid", "sad", "curious", "smug", "bored",
               "suspicious", "grateful", "confused", "amused"]


def dump_session_emotes(engine, session_id: int, path: str) -> None:
    slot = engine.table.slots[session_id]
    row_logits = engine.emote_logits[slot.row]
    top = int(torch.argmax(row_logits).item())  # ok: FC101
    with open(path, "w") as f:
        json.dump({"session": session_id, "npc": slot.npc_id, "emote": EMOTE_NAMES[top],
                   "scores": row_logits.float().cpu().tolist()}, f)
