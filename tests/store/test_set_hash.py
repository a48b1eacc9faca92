"""The presence's hash of a set of jobs made in slices (``set_hash``) is
``config_hash``'s to the byte: other instances, of any version, compare it with
theirs (docs/PERFORMANCE.md, "One scrape at 100,000 jobs")."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.slices import CHUNK, Budget
from sidecar.store.digests import config_hash, set_hash
from tests.support import examples

NAMES = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
HASHES = st.text(alphabet="0123456789abcdef", min_size=12, max_size=12)
# Names that make the hash of more than one chunk, among which the examples' fall.
_rng = random.Random(49)
MANY = {
    "".join(_rng.choices("abcdefghijklmnopqrstuvwxyz-0123456789", k=8)): f"{i:012x}"
    for i in range(2 * CHUNK + 1)
}


@settings(max_examples=examples(200))
@given(st.dictionaries(NAMES, HASHES, max_size=20), st.booleans())
def test_set_hash_is_config_hash(some: dict[str, str], many: bool) -> None:
    hashes = {**MANY, **some} if many else some

    async def sliced() -> str:
        return await set_hash(hashes, Budget(0.0), str)  # a yield after every step

    assert asyncio.run(sliced()) == config_hash(hashes)


async def test_the_items_hash_is_taken_by_hash_of() -> None:
    items = {f"tenant-{i:05d}": (i, f"{i:012x}") for i in range(2 * CHUNK + 3)}
    got = await set_hash(items, Budget(0.0), lambda item: item[1])
    assert got == config_hash({name: item[1] for name, item in items.items()})
    assert await set_hash({}, Budget(0.0), str) == config_hash({})
