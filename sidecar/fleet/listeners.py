"""The fleet's key listeners: each told of the keys of the families it names.

Every run writes its lease ``run.<job>.<slot>`` and deletes it, and every
sidecar's watch delivers both: a burst of 10,000 runs is 20,000 keys on each
sidecar (docs/PERFORMANCE.md "The burst"). A listener of job keys or due
attempts has nothing to do with them; registered with its families
(``append(listener, "job.")``) it is not called for them. A listener
registered without families is told of every key, as before. The ``""`` of a
full re-read (sidecar/store/watch.py) goes to every listener.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

KeyListener = Callable[[str], None]

# Heads of keys looked up (one per family of sidecar/store/keyfamilies.py): bounded
# anyway, as only keys of a family reach the listeners (View.apply).
MAX_HEADS = 64


class KeyListeners:
    """The listeners of keys the watch delivers, each with its families (None: all)."""

    def __init__(self) -> None:
        self._listeners: list[tuple[KeyListener, frozenset[str] | None]] = []
        # Per key head (``run.``): the listeners that want its keys, in order.
        self._by_head: dict[str, list[KeyListener]] = {}

    def append(self, listener: KeyListener, *families: str) -> None:
        """Tell `listener` of the keys of `families` (``"job."``), of every key when none."""
        for family in families:
            if not family.endswith(".") or family.count(".") != 1:
                raise ValueError(f"a key family is a key's head with its dot: {family!r}")
        self._listeners.append((listener, frozenset(families) if families else None))
        self._by_head = {}  # a fresh dict: a dispatch under way keeps its list

    def remove(self, listener: KeyListener) -> None:
        """Forget `listener` (its first registration); ValueError when it is not one."""
        for i, (each, _) in enumerate(self._listeners):
            if each == listener:
                del self._listeners[i]
                self._by_head = {}
                return
        raise ValueError(f"not a key listener: {listener!r}")

    def for_key(self, key: str) -> list[KeyListener]:
        """The listeners to tell of `key` (every one for ``""``), in registration order."""
        if not key:
            return [each for each, _ in self._listeners]
        head, dot, _ = key.partition(".")
        head += dot
        found = self._by_head.get(head)
        if found is None:
            found = [each for each, fams in self._listeners if fams is None or head in fams]
            if len(self._by_head) >= MAX_HEADS:
                self._by_head = {}
            self._by_head[head] = found
        return found

    def __iter__(self) -> Iterator[KeyListener]:
        return iter([each for each, _ in self._listeners])

    def __contains__(self, listener: object) -> bool:
        return any(each == listener for each, _ in self._listeners)

    def __len__(self) -> int:
        return len(self._listeners)
