"""The parts of a job's life, made and joined in one place.

``wire(ctx, trigger)`` makes the ``Jobs`` of one sidecar with each part that
acts on its behalf (catch-up, skips, backfills, one-off runs, the aftermath,
the recorder, due attempts, lost runs, overlap policies, claim candidates),
every one from the same ``Context`` (sidecar/run/context.py). The parts that
claim or run call back into ``Jobs`` (``attempt``, ``_start_run``,
``_run_tracked``, ``_next_slot``): ``Jobs`` calls ``_parts`` with itself while
it is constructed and keeps the ``Parts`` it gets; nothing is set on it after.
The daemon (sidecar/cli/daemon.py) and the tests' ``make_jobs`` fixture both
call ``wire``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.after.aftermath import Aftermath
from sidecar.config.job_entry import WAITING
from sidecar.config.jobset import Change
from sidecar.core.wire import EVERY
from sidecar.fleet.candidates import Candidates
from sidecar.obs.spans import span_exporter
from sidecar.run.catchup import CatchUp
from sidecar.run.claimwindow import ClaimWindow
from sidecar.run.context import Context
from sidecar.run.job_loop import Jobs, Parts
from sidecar.run.lostruns import LostRuns
from sidecar.run.onkey import DueOnFirstUse, OnFirstKey
from sidecar.run.record import Recorder
from sidecar.run.skips import SkipRecorder, Unclaimed
from sidecar.run.straybuffers import StrayBuffers
from sidecar.run.trigger import Trigger
from sidecar.run.unanswered import Unanswered

if TYPE_CHECKING:
    from sidecar.config.load import JobConfig
    from sidecar.run.atruns import AtRuns
    from sidecar.run.backfill import Backfills
    from sidecar.run.claim import Claim
    from sidecar.run.overlap import Overlap
    from sidecar.run.retries import DueAttempts


def _secret(trigger: Trigger) -> bytes | None:
    """The current signing secret: webhooks are signed like triggers."""
    signer = trigger.signer
    return signer.secrets[0] if signer is not None else None


def wire(ctx: Context, trigger: Trigger) -> Jobs:
    """The job loops of one sidecar, with every part of a job's life joined to them."""
    return Jobs(ctx, trigger, parts=lambda jobs: _parts(ctx, trigger, jobs))


def _parts(ctx: Context, trigger: Trigger, jobs: Jobs) -> Parts:
    """The parts of `jobs`, made while it is constructed; each listener joined to the
    fleet's watch in the order they were always joined."""
    config, metrics, clock, fleet = ctx.config, ctx.metrics, ctx.clock, ctx.fleet

    def lost_claim(job: JobConfig, claim: Claim) -> None:  # jobs.window: made below
        jobs.window.lost_claim(job, claim)

    # Slots not claimed: counted, said, recorded when kept from running; a skip its
    # own config decided that came second has its winner judged (lost_claim); a claim
    # given up without an answer has its slot's fate asked for (unanswered.py).
    skips = SkipRecorder(ctx, lost_claim)
    unclaimed = Unclaimed(ctx, skips, Unanswered(ctx, lost_claim))
    # Slots missed while this sidecar was away (sidecar/run/catchup.py).
    catch_up = CatchUp(ctx, jobs.attempt, jobs._next_slot)

    # Backfills and one-off runs: made, their code imported, on the first key
    # of their kind (sidecar/run/onkey.py); most configs never see one.
    def backfills() -> Backfills:
        from sidecar.run.backfill import Backfills

        # `skips`: resume --catchup settles a slot's fate first (sidecar/run/catchupfate.py).
        return Backfills(ctx, jobs._run_tracked, lost_claim, skips)

    on_backfill = OnFirstKey("backfill", fleet.view, backfills)
    fleet.key_listeners.append(on_backfill.changed, on_backfill.prefix)

    # One-off runs at a set time (sidecar/run/atruns.py): claimed like slots.
    def at_runs() -> AtRuns:
        from sidecar.run.atruns import AtRuns

        return AtRuns(ctx, unclaimed, jobs._start_run, lost_claim)

    on_at = OnFirstKey("at", fleet.view, at_runs)
    fleet.key_listeners.append(on_at.changed, on_at.prefix)
    # Jobs run after another job's runs (sidecar/run/chains.py): its code imported
    # only when a job has ``after`` (a job of the state bucket cannot).
    if any(job.after is not None for job in config.jobs):
        from sidecar.run.chains import Chains

        Chains(ctx, unclaimed, jobs._start_run, lost_claim).begin()

    # run_on: every: the slots an instance missed, counted (sidecar/run/everymissed.py):
    # made now if a job of the file is `every`, else for the first of the state bucket's.
    def every_missed(change: Change | None = None) -> None:
        jobs_now = ctx.jobs.all if change is None else change.put
        if not made and any(job.run_on == EVERY for job in jobs_now):
            from sidecar.run.everymissed import EveryMissed

            made.append(True)
            EveryMissed(ctx).begin()

    made: list[bool] = []
    every_missed()
    ctx.jobs.subscribe(every_missed)
    # Pings, notifications, auto-pause, anomalies, spans (sidecar/after/aftermath.py).
    aftermath = Aftermath(
        config,
        metrics,
        clock,
        ctx.keys,
        _secret(trigger),
        fleet,
        exporter=span_exporter(config),
    )
    # Every ending of a run is recorded there (sidecar/run/record.py).
    spec = ctx.spec
    recorder = Recorder(ctx.js, spec.name, spec.prefix, config.instance_id, metrics, aftermath)

    # What follows a failed or lost run: retries and due attempts (made, their code
    # imported, when first needed: sidecar/run/onkey.py), lost runs.
    def due_attempts() -> DueAttempts:
        from sidecar.run.retries import DueAttempts

        return DueAttempts(ctx, jobs.attempt)

    due = DueOnFirstUse(due_attempts)
    lost = LostRuns(
        ctx, recorder, judges_foreign=fleet.orphans.judges, view=fleet.view, rerun=due.rerun
    )
    fleet.removal_listeners.append(lost.removed)
    fleet.key_listeners.append(due.due_changed, "due.")
    # Winners of claims lost here that died before their lease (sidecar/run/claimwindow.py).
    window = ClaimWindow(ctx, lost)
    fleet.key_listeners.append(window.delivered)
    # buffer.<job> of a job that is not buffer_one here: counted (straybuffers.py).
    fleet.key_listeners.append(StrayBuffers(ctx).changed, "buffer.")

    # overlap: replace and buffer_one (sidecar/run/overlap.py). Made, its code
    # imported, now if a job has one of them, else for the first job of the state
    # bucket's with one (Jobs.overlap_part).
    def overlap() -> Overlap:
        from sidecar.run.overlap import Overlap

        return Overlap(ctx, trigger, jobs.run_kept)

    def overlap_for(change: Change) -> None:  # it listens to the bucket from then on
        if any(job.overlap in WAITING for job in change.put):
            jobs.overlap_part()

    ctx.jobs.subscribe(overlap_for)
    waiting = overlap() if any(job.overlap in WAITING for job in ctx.jobs.all) else None
    # claim.candidates: only k instances claim a slot at its time (sidecar/fleet/candidates.py).
    candidates = Candidates(
        config.instance_id,
        metrics,
        clock,
        fleet,
        ctx.tasks.spawn,
        ctx.sleeper.until,
        lambda job, slot: jobs.attempt(job, slot, clock.wall(), deferred=True),
    )
    return Parts(
        unclaimed=unclaimed,
        catch_up=catch_up,
        backfills=on_backfill,
        at_runs=on_at,
        aftermath=aftermath,
        recorder=recorder,
        due=due,
        lost=lost,
        window=window,
        candidates=candidates,
        make_overlap=overlap,
        overlap=waiting,
    )
