"""One error tree: every exception class the sidecar defines is a SidecarError.

Two private signals are the exception, and stay inside their module: ``Stopped``
(the demo's Ctrl-C) and ``_Unusual`` (the config's YAML handed to PyYAML).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import sidecar
from sidecar.core.errors import SidecarError

PRIVATE_SIGNALS = {"sidecar.cli.demo.Stopped", "sidecar.config.yamlfile._Unusual"}


def defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(sidecar.__path__, "sidecar."):
        if info.name in ("sidecar.__main__", "sidecar.obs.otlp"):
            continue  # the entry point runs; otlp needs the otel extra (its own test)
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
            ):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_exception_of_the_sidecar_is_in_the_tree() -> None:
    found = defined_exceptions()
    assert "sidecar.core.errors.TriggerTimeout" in found  # the walk sees the tree itself
    outside = sorted(
        name
        for name, cls in found.items()
        if not issubclass(cls, SidecarError) and name not in PRIVATE_SIGNALS
    )
    assert outside == []


def test_every_exception_is_defined_in_errors_py() -> None:
    """Drawn in one place: errors.py's docstring names each, and each lives there
    (PlaintextRefused, also a nats-py error raised inside its connect, excepted)."""
    found = defined_exceptions()
    elsewhere = sorted(
        name
        for name in found
        if not name.startswith("sidecar.core.errors.")
        and name not in PRIVATE_SIGNALS
        and name != "sidecar.core.natspy.PlaintextRefused"
    )
    assert elsewhere == []
    doc = importlib.import_module("sidecar.core.errors").__doc__ or ""
    for name in found:
        if name.startswith("sidecar.core.errors.") or name.endswith("PlaintextRefused"):
            assert name.rsplit(".", 1)[1] in doc, name
