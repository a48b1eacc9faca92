"""The config file's YAML: safe, a key given twice refused, errors with file and line.

libyaml parses when PyYAML has it (a seventh of the time and a third of the
memory of the pure-Python parser for a large config: 1,000 jobs, 31 vs
226 ms). Building the Python values from libyaml's nodes is PyYAML's Python
code, and for a config it was the larger half of the time: a config is plain
maps, lists and scalars, so ``_Plain`` builds those directly (with PyYAML's
own scalar constructors) and gives every other document (anchors, merge
keys, tags, any error) to PyYAML's constructor, which decides as before.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import yaml
from yaml.constructor import ConstructorError

from sidecar.config.fields import read_capped
from sidecar.core.errors import ConfigError

if TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader
else:
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
# The scalars built here, by PyYAML's own constructors (not !!set, !!omap,
# !!pairs: theirs build a value in steps, for PyYAML's constructor alone).
_SCALARS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "binary", "timestamp")
)


class _Loader(_SafeLoader):
    """The safe loader, refusing a key given twice in one map."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        _check_keys(node)
        return super().construct_mapping(node, deep)


def _check_keys(node: yaml.MappingNode) -> None:
    seen: set[str] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value != "<<":
            if key_node.value in seen:
                raise ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                )
            seen.add(key_node.value)


class _Unusual(Exception):
    """Not a document of plain maps, lists and scalars: PyYAML's constructor builds it."""


class _Plain:
    """Maps, lists and scalars with their implicit tags, each node reached once."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader
        self.seen: set[int] = set()

    def build(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _STR:
                return node.value
            if node.tag not in _SCALARS:
                raise _Unusual
            return self.loader.yaml_constructors[node.tag](self.loader, node)
        if id(node) in self.seen:  # an alias: shared values, and no blow-up
            raise _Unusual
        self.seen.add(id(node))
        if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
            return [self.build(item) for item in node.value]
        if not isinstance(node, yaml.MappingNode) or node.tag != _MAP:
            raise _Unusual
        _check_keys(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                raise _Unusual
            out[self.build(key_node)] = self.build(value_node)
        return out


def load(text: str) -> object:
    """The document in ``text``, as ``yaml.load(text, Loader=_Loader)`` returns it."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            return _Plain(loader).build(node)
        except Exception:
            return loader.construct_document(node)
    finally:
        loader.dispose()


# A value that starts with `*` (an alias in YAML) or `@` (reserved): a cron
# line or an interval left unquoted, `schedule: */5 * * * *`.
_UNQUOTED = re.compile(r"^\s*(?:-\s+)?(?:(?P<key>[\w.-]+):\s+)?(?P<value>[*@][^#]*?)\s*(?:#.*)?$")


def _quote_hint(line: str) -> str:
    """What to write instead when the failing line holds such a value; else ""."""
    found = _UNQUOTED.match(line)
    if found is None:
        return ""
    key = f"{found['key']}: " if found["key"] else ""
    what = "the cron line" if found["key"] in (None, "schedule") else "the value"
    return (
        f"; quote {what} (a value starting with {found['value'][0]} must be quoted "
        f'in YAML): {key}"{found["value"]}"'
    )


#: The largest config file: a thousand jobs take about 200 KiB.
MAX_CONFIG_FILE = 16 << 20


def read_yaml(
    path: str, limit: int = MAX_CONFIG_FILE, key: str = "config", stdin: bool = False
) -> object:
    """The YAML document in the file ``path`` (``-`` with `stdin`: standard input), at
    most `limit` bytes; ConfigError(`key`, ...) with its line."""
    where = "standard input" if stdin and path == "-" else path
    try:
        text = read_capped(path, limit, key, stdin).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(key, f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(key, f"{where}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(key, f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        return load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{where}, line {mark.line + 1}, column {mark.column + 1}" if mark else where
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        lines = text.splitlines()
        hint = _quote_hint(lines[mark.line]) if mark and mark.line < len(lines) else ""
        raise ConfigError(key, f"{at}: {problem}{hint}") from None
    except Exception as exc:  # PyYAML's own slips too (`!!int ''`: IndexError)
        raise ConfigError(key, f"{where}: invalid YAML ({type(exc).__name__})") from None
