"""The config of docs/CONFIG.md: YAML and env in, frozen dataclasses out."""
