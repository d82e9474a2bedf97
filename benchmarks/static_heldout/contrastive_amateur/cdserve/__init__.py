"""Contrastive decoding server: an expert and an amateur model decode in lockstep."""
