"""Speculative decoding in the core: the system n-gram drafter and draft verification."""
