"""The config of SPEC.md: YAML and env in, frozen dataclasses out."""
