"""cancel_all: a shutdown ends tasks whose first cancel was lost, and never hangs."""

from __future__ import annotations

import ast
import asyncio
import contextlib
from pathlib import Path

import pytest

from sidecar.core.tasks import TaskSet, cancel_all


async def _loses_one_cancel(answer: asyncio.Future[None]) -> None:
    """A loop whose cancel lands as a request's answer arrives: on Python 3.11
    asyncio.wait_for returns the answer and the cancel is gone (CPython gh-86296).
    Written out here, so that it happens on every Python."""
    with contextlib.suppress(asyncio.CancelledError):  # what wait_for did with the cancel
        await answer
    beats = 0
    while True:  # the loop runs on, as the presence and watch loops did
        await asyncio.sleep(0.01)
        beats += 1


async def test_a_task_that_lost_its_cancel_is_cancelled_again_and_ends() -> None:
    answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(_loses_one_cancel(answer))
    await asyncio.sleep(0)
    left = await asyncio.wait_for(cancel_all([task], timeout=2), 5)
    assert left == set()
    assert task.cancelled()


async def test_a_single_cancel_would_have_hung() -> None:
    """What the shutdown did before: cancel once, await. It never ends."""
    answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(_loses_one_cancel(answer))
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.5)
    assert not done
    assert await cancel_all([task], timeout=2) == set()


async def test_a_task_that_never_ends_is_given_up_after_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    left = await cancel_all([task], timeout=0.3)
    assert left == {task}
    assert loop.time() - started < 2
    assert "task stubborn still running" in caplog.text
    # Let it go for good: the event loop must not keep it.
    task.get_coro().close()  # type: ignore[union-attr]


async def test_finished_and_failed_tasks_are_fine() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    assert await cancel_all([failed, done]) == set()


async def test_a_task_set_spawns_drops_ended_tasks_and_cancels_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    said, quiet = TaskSet("a said task"), TaskSet("a quiet task", say=False)

    async def fails() -> None:
        raise OverflowError("a bug")

    forever = said.spawn(asyncio.sleep(3600))
    done, _ = await asyncio.wait({said.spawn(fails()), quiet.spawn(fails())})
    await asyncio.sleep(0)  # the done callbacks
    assert said == {forever} and not quiet
    assert [r.getMessage() for r in caplog.records] == ["a said task failed"]
    assert all(task.exception() is not None for task in done)
    assert await said.cancel(timeout=2) == set()
    assert forever.cancelled() and not said


def test_every_task_is_started_in_a_task_set() -> None:
    """One way to start a background task: ``TaskSet.spawn`` of its owner, drained at
    stop; no module calls ``asyncio.create_task`` itself."""
    package = Path(__file__).resolve().parents[2] / "sidecar"
    callers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "create_task"
            ):
                callers.add(str(path.relative_to(package)))
    assert callers == {"core/tasks.py"}, callers
