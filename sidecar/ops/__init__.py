"""The operators' one-shot commands: each connects once, does its work, closes."""
