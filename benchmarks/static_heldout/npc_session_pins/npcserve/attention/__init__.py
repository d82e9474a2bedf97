from npcserve.attention.backend import NPCAttnBackend

__all__ = ["NPCAttnBackend"]
