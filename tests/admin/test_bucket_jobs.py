"""Jobs added at run time (issue 42, item 5): ``job.<name>`` keys of the state bucket.

Three real sidecar processes on a real nats-server: a job added with
``job add`` is taken up by all three within about a second and each slot
runs once; adding it again is idempotent; ``job update`` changes its
schedule; ``job remove`` stops it while a run in flight finishes; a job of
the file wins over a bucket job of the same name; a value that is not a
valid job is counted as hostile input and not run.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from sidecar.admin.jobcheck import judge, kept_at, kept_by, parse_bucket_job, shown_at
from sidecar.config.load import Config, ConfigError, parse_config
from sidecar.core.clock import rfc3339
from tests.support import (
    NatsServer,
    RecordingApp,
    Sidecar,
    base,
    cli_config,
    job,
    results,
    run_cli,
    sidecars,
    slots,
    wait_for,
)

NOT_CHECKED = "skipped: stream not checked yet"
TOKEN = "s3cret-token-for-bucket-jobs-0123"
LEFT = "job dyn (id tenant-7/report) left the state bucket"
# A file job that never comes due during a test: the config needs one.
YEARLY = {"name": "keep", "schedule": "0 0 1 1 *"}


def job_file(tmp_path: Path, name: str, data: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def taken_up(p: Sidecar, name: str) -> bool:
    """The sidecar has the job's loop running (its next slot is set)."""
    return (p.metric("anarchon_job_next_run_timestamp_seconds", {"job": name}) or 0) > 0


def fleet_hashes(cfg: str) -> set[str] | None:
    """The instances' job-settings hashes as `status --json` reads them; None while
    they differ (an instance has not told its new jobs yet)."""
    obj = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
    hashes = {i["config_hash"] for i in obj["instances"]}
    return None if obj["config_mismatch"] or len(hashes) != 1 else hashes


def put_key(url: str, bucket: str, key: str, value: bytes) -> None:
    """Write a key of the state bucket as anyone with write access could."""

    async def put() -> None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(bucket)
            await kv.put(key, value)
        finally:
            await nc.close()

    asyncio.run(put())


def test_add_update_remove_on_three_sidecars(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [YEARLY])
    cfg = cli_config(tmp_path, config)
    dyn = job("dyn", id="tenant-7/report")
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        # add: every sidecar takes it up within about a second
        added = run_cli("job", "add", job_file(tmp_path, "dyn", dyn), "-c", cfg)
        assert added.returncode == 0, added.stderr
        assert "dyn (id tenant-7/report): added to the state bucket" in added.stdout
        at = time.time()
        wait_for(
            lambda: all(taken_up(p, "dyn") for p in procs), 5, what="dyn taken up by all three"
        )
        took = time.time() - at
        print(f"dyn taken up by all three {took:.3f}s after `job add` returned")
        assert took < 2.5, f"taken up after {took:.2f}s"
        for p in procs:
            assert "job dyn (id tenant-7/report) taken up from the state bucket" in p.log()
        wait_for(lambda: len(slots(http_app, "/jobs/dyn")) >= 4, 15, what="runs of dyn")
        assert not any(NOT_CHECKED in p.log() for p in procs)

        # the same job with the same id again: nothing changes; another id: refused
        again = run_cli("job", "add", job_file(tmp_path, "dyn", dyn), "-c", cfg)
        assert again.returncode == 0, again.stderr
        assert "unchanged" in again.stdout
        other = run_cli("job", "add", job_file(tmp_path, "dyn", dyn), "-c", cfg, "--id", "x")
        assert other.returncode == 1
        assert "with id 'tenant-7/report', not 'x'" in other.stderr
        changed = run_cli(
            "job", "add", job_file(tmp_path, "dyn", {**dyn, "jitter": "0ms"}), "-c", cfg
        )
        assert changed.returncode == 1 and "`job update` changes it" in changed.stderr

        # update: every second slot from now on
        before = fleet_hashes(cfg)
        assert len(before) == 1, before  # the same jobs everywhere
        updated = run_cli(
            "job",
            "update",
            job_file(tmp_path, "dyn", {**dyn, "schedule": "*/2 * * * * *"}),
            "-c",
            cfg,
        )
        assert updated.returncode == 0, updated.stderr
        since = time.time()
        # Each presence says so at once, not at its next renewal (every 5 s): the
        # fleet never shows "settings differ" for long.
        wait_for(lambda: fleet_hashes(cfg) not in (before, None), 1.5, what="new presences")
        assert len(fleet_hashes(cfg) or ()) == 1
        wait_for(
            lambda: len([s for s in slots(http_app, "/jobs/dyn") if s / 1000 > since + 2]) >= 2,
            15,
            what="runs on the new schedule",
        )
        late = [s for s in slots(http_app, "/jobs/dyn") if s / 1000 > since + 2]
        assert all(s % 2000 == 0 for s in late), late

        # remove while a run is in flight: the run finishes and is recorded
        http_app.delay["/jobs/dyn"] = 2.5
        asked = time.time()
        wait_for(
            lambda: any(r.at > asked for r in http_app.requests_for("/jobs/dyn")),
            10,
            what="a slow run",
        )
        in_flight = next(r for r in http_app.requests_for("/jobs/dyn") if r.at > asked)
        removed = run_cli("job", "remove", "dyn", "-c", cfg)
        assert removed.returncode == 0, removed.stderr
        gone = time.time()
        wait_for(lambda: all(LEFT in p.log() for p in procs), 5, what="dyn stopped everywhere")
        assert not any(taken_up(p, "dyn") for p in procs)  # next run 0: out of the alerts
        slot = int(in_flight.headers["X-Anarchon-Slot"])
        wait_for(
            lambda: any(
                m.data.get("slot") == slot and m.data.get("status") == "succeeded"
                for m in results(nats_server.url, "dyn")
            ),
            10,
            what="the run in flight recorded",
        )
        time.sleep(3)
        after = [s for s in slots(http_app, "/jobs/dyn") if s / 1000 > gone + 1]
        assert after == [], after
        missing = run_cli("job", "remove", "dyn", "-c", cfg)
        assert missing.returncode == 1 and "no such job" in missing.stderr

    # exactly once: no slot reached the app twice
    counts = Counter(slots(http_app, "/jobs/dyn"))
    assert counts and max(counts.values()) == 1, counts


def test_a_sidecar_started_after_job_add_takes_the_job_up_from_its_first_read(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    """The runner of the bucket's jobs is made on the first ``job.`` key
    (sidecar/admin/jobkeys.py); a key already there at start comes with the
    start's read of the bucket, not as a change: it must be taken up too."""
    config = base(nats_server, http_app, [YEARLY])
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [("first", config, {})]) as (first,):
        added = run_cli("job", "add", job_file(tmp_path, "dyn", job("dyn")), "-c", cfg)
        assert added.returncode == 0, added.stderr
        wait_for(lambda: taken_up(first, "dyn"), 5, what="dyn taken up by the first")
        with sidecars(tmp_path, [("late", config, {})]) as (late,):
            wait_for(lambda: taken_up(late, "dyn"), 5, what="dyn taken up by the late one")
            assert "job dyn (id dyn) taken up from the state bucket" in late.log()
            since = time.time()
            wait_for(
                lambda: len([s for s in slots(http_app, "/jobs/dyn") if s / 1000 > since]) >= 3,
                15,
                what="runs of dyn with both",
            )
            assert not any(NOT_CHECKED in p.log() for p in (first, late))
    counts = Counter(slots(http_app, "/jobs/dyn"))
    assert counts and max(counts.values()) == 1, counts


def post(
    sc: Sidecar, path: str, body: dict[str, Any], token: str | None = TOKEN
) -> tuple[int, Any]:
    req = urllib.request.Request(sc.base_url + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_file_wins_and_hostile_values_are_counted_and_not_run(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    config = base(nats_server, http_app, [YEARLY])
    config["target"]["headers"] = {"Authorization": "Bearer the-apps-own"}
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops:{TOKEN}\n")
    config["admin"] = {"token_file": str(tokens)}
    cfg = cli_config(tmp_path, config)
    # The command refuses before writing: the key's path, exit 2.
    bad = run_cli("job", "add", job_file(tmp_path, "bad", job("bad", schedule="nope")), "-c", cfg)
    assert bad.returncode == 2 and "config error: job.schedule:" in bad.stderr, bad.stderr
    url = run_cli(
        "job",
        "add",
        job_file(tmp_path, "far", {**job("far"), "request": {"url": "http://10.0.0.1"}}),
        "-c",
        cfg,
    )
    assert url.returncode == 2 and "job.request.url:" in url.stderr, url.stderr
    same = run_cli("job", "add", job_file(tmp_path, "keep", job("keep")), "-c", cfg)
    assert same.returncode == 2 and "the config file has a job 'keep'" in same.stderr
    with sidecars(tmp_path, [(f"s{i}", config, {}) for i in range(3)]) as procs:
        bucket = "CRON_STATE"
        # Written by someone else, past the command's checks.
        put_key(nats_server.url, bucket, "job.keep", json.dumps(job("keep", id="k")).encode())
        put_key(
            nats_server.url, bucket, "job.evil", json.dumps(job("evil", schedule="nope")).encode()
        )
        put_key(nats_server.url, bucket, "job.junk", b"\xff not json")

        def counted() -> bool:
            return all(
                p.metric("anarchon_hostile_input_total", {"what": "job"}) == 2 for p in procs
            )

        wait_for(counted, 5, what="two hostile job keys counted on all three")
        wait_for(
            lambda: all("state bucket: job.keep is ignored" in p.log() for p in procs),
            5,
            what="the file wins, said",
        )
        time.sleep(2)
        assert slots(http_app, "/jobs/keep") == []
        assert slots(http_app, "/jobs/evil") == []

        status = run_cli("status", "-c", cfg, "--json")
        assert status.returncode == 0, status.stderr
        obj = json.loads(status.stdout)
        assert [(j["name"], j["source"]) for j in obj["jobs"]] == [("keep", "file")]
        states = {i["name"]: i["state"] for i in obj["bucket_jobs"]}
        assert states == {"keep": "shadowed", "evil": "invalid", "junk": "invalid"}
        text = run_cli("status", "-c", cfg)
        assert "keep (state bucket, id k): not run: the config file has a job" in text.stdout

        # A valid one beside them runs, and status says where it came from. With
        # catchup it never catches up a slot from before it was added.
        added_ms = round(time.time() * 1000)
        ok = run_cli("job", "add", job_file(tmp_path, "ok", job("ok", catchup="all")), "-c", cfg)
        assert ok.returncode == 0, ok.stderr
        wait_for(lambda: len(slots(http_app, "/jobs/ok")) >= 2, 10, what="runs of ok")
        # Its first slots are claimed: the stream's fit is judged when it is taken up.
        assert not any(NOT_CHECKED in p.log() for p in procs)
        assert min(slots(http_app, "/jobs/ok")) >= added_ms, (added_ms, slots(http_app, "/jobs/ok"))
        obj = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
        sources = {j["name"]: (j["source"], j["id"]) for j in obj["jobs"]}
        assert sources == {"keep": ("file", None), "ok": ("bucket", "ok")}
        # The page lists it too.
        code, body = procs[0].get("/api/v1/jobs")
        assert code == 200, body
        listed = {j["name"]: (j["source"], j["id"]) for j in json.loads(body)["jobs"]}
        assert listed == sources
        code, body = procs[0].get("/api/v1/fleet")
        assert {i["name"]: i["state"] for i in json.loads(body)["bucket_jobs"]} == {
            **states,
            "ok": "run",
        }
        # A running job's key keeps no bytes in the view (issue 49): its running
        # entry keeps who wrote it and when, and the page lists them as status does.
        stored = {i["name"]: i for i in obj["bucket_jobs"]}["ok"]
        served = {i["name"]: i for i in json.loads(body)["bucket_jobs"]}["ok"]
        assert stored["by"] and stored["at"] and served == stored
        # The same job written again by someone else, without an id and with an
        # `at` of its own: still the same job (not restarted), listed as stored.
        again = {**job("ok", catchup="all"), "by": "someone else", "at": "2026-01-01 noon"}
        put_key(nats_server.url, bucket, "job.ok", json.dumps(again).encode())

        def fleet_ok() -> dict[str, Any]:
            code, body = procs[0].get("/api/v1/fleet")
            assert code == 200, body
            items: list[dict[str, Any]] = json.loads(body)["bucket_jobs"]
            return {i["name"]: i for i in items}["ok"]

        wait_for(lambda: fleet_ok()["by"] == "someone else", 10, what="the new writer listed")
        obj = json.loads(run_cli("status", "-c", cfg, "--json").stdout)
        stored = {i["name"]: i for i in obj["bucket_jobs"]}["ok"]
        assert stored["id"] is None and stored["at"] == "2026-01-01 noon"
        assert fleet_ok() == stored

        # The API with the admin token: the same checks, the same answers.
        path = "/api/v1/bucket-jobs/viaapi"
        assert post(procs[1], f"{path}/add", job("viaapi"), token=None)[0] == 401
        code, answer = post(procs[1], f"{path}/add", {**job("viaapi"), "schedule": "61 * * * *"})
        assert code == 400 and answer["key"] == "job.schedule", answer
        headers = {"request": {"headers": {"authorization": "Bearer mine"}}}
        code, answer = post(procs[1], f"{path}/add", {**job("viaapi"), **headers})
        assert code == 400 and answer["key"] == "job.request.headers.authorization", answer
        code, answer = post(procs[1], f"{path}/add", {**job("viaapi"), "id": "t1"})
        assert (code, answer["result"]) == (200, "created"), answer
        assert post(procs[2], f"{path}/add", {**job("viaapi"), "id": "t1"})[1]["result"] == (
            "unchanged"
        )
        wait_for(lambda: len(slots(http_app, "/jobs/viaapi")) >= 1, 10, what="a run of viaapi")
        # The app's own Authorization header stays the file's.
        sent = http_app.requests_for("/jobs/viaapi")[0]
        assert sent.headers["Authorization"] == "Bearer the-apps-own"
        assert post(procs[0], f"{path}/remove", {"id": "other"})[0] == 409
        code, answer = post(procs[0], f"{path}/remove", {"id": "t1"})
        assert (code, answer["result"]) == (200, "removed"), answer
        assert post(procs[0], f"{path}/remove", {})[0] == 404

        # A sidecar started later runs the bucket's jobs from its start, and judges
        # the hostile keys as the others did.
        late = Sidecar(tmp_path, "late", config, {}).start().wait_ready()
        try:
            wait_for(lambda: taken_up(late, "ok"), 5, what="ok taken up by a later sidecar")
            assert late.metric("anarchon_hostile_input_total", {"what": "job"}) == 2
            assert not taken_up(late, "viaapi")
        finally:
            late.terminate(30)


# ---------------------------------------------------------------------- the checks alone


def parsed_config(**extra: Any) -> Config:
    data = {
        "nats": {"servers": ["nats://127.0.0.1:4222"], "history_size": 50},
        "target": {"url": "http://127.0.0.1:8080", "headers": {"Authorization": "Bearer app"}},
        "defaults": {"ping": "https://hc.example/ping/{job}"},
        "jobs": [YEARLY],
        **extra,
    }
    return parse_config(data, {})


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"schedule": "61 * * * *"}, "job.schedule", "bad minute"),
        ({"request": {"url": "http://127.0.0.1:9999"}}, "job.request.url", "config file's target"),
        ({"ping": "https://elsewhere.example/"}, "job.ping", "defaults.ping"),
        (
            {"request": {"headers": {"AUTHORIZATION": "Bearer x"}}},
            "job.request.headers.AUTHORIZATION",
            "target.headers",
        ),
        (
            {"request": {"headers": {"X-Anarchon-Slot": "1"}}},
            "job.request.headers.X-Anarchon-Slot",
            "reserved",
        ),
        *(
            (
                {"request": {"headers": {name: "internal-admin"}}},
                f"job.request.headers.{name}",
                "cannot set this header",
            )
            for name in (
                "Host",
                "Forwarded",
                "X-Forwarded-Host",
                "x-forwarded-for",
                "Proxy-Authorization",
                "X-HTTP-Method-Override",
                "Connection",
                "Transfer-Encoding",
            )
        ),
        ({"history_size": 51}, "job.history_size", "at most the stream's history size 50"),
        ({"jitter": "5m"}, "job.jitter", "duplicate_window"),
        ({"nope": 1}, "job.nope", "unknown key"),
        ({"id": ""}, "job.id", "an id of 1 to 200"),
    ],
)
def test_a_bucket_job_is_checked_as_the_files_plus_its_own_rules(
    extra: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_bucket_job(parsed_config(), {**job("t"), **extra}, "job")
    assert caught.value.key == key and words in caught.value.message, caught.value


def test_a_bucket_job_gets_the_files_target_and_defaults() -> None:
    config = parsed_config()
    spec = parse_bucket_job(config, {**job("t"), "request": {"headers": {"X-Tenant": "42"}}}, "job")
    assert spec.id == "t"  # no id: the name
    assert spec.job.request.url == config.target.url
    assert dict(spec.job.request.headers) == {"Authorization": "Bearer app", "X-Tenant": "42"}
    assert spec.job.ping is not None and spec.job.ping.url == "https://hc.example/ping/t"
    # by/at are not the job: the same job written again by someone else is the same
    again = parse_bucket_job(
        config, {**job("t"), "request": {"headers": {"X-Tenant": "42"}}, "by": "x"}, "job"
    )
    assert again.canon == spec.canon
    with pytest.raises(ConfigError) as caught:
        judge(config, "job.other", job("t"))
    assert caught.value.key == "job.other.name"


def test_a_running_jobs_by_and_at_are_kept_compact_and_given_back_exactly() -> None:
    """issue 49: a running job keeps its stored ``at`` as epoch ms when that is the
    text the writes make, anything else as it is; ``by`` one string per writer."""
    written = rfc3339(time.time())
    assert isinstance(kept_at(written), int) and shown_at(kept_at(written)) == written
    odd: list[object] = [
        None,
        "yesterday",
        "2026-12-06T19:54:10.123+00:00",  # the same instant, other text
        "2026-12-06T19:54:10.123",
        "2026-12-06T19:54:10Z",
        "2026-12-06T19:54:10.123456Z",
        1765050850123,  # an int stored is not epoch ms kept
        True,
        1.5,
        ["a"],
        {"b": 1},
    ]
    for at in odd:
        assert shown_at(kept_at(at)) == at and type(shown_at(kept_at(at))) is type(at), at
    assert not isinstance(kept_at("2026-12-06T19:54:10.123+00:00"), int)
    assert kept_by("ops" + str(len(odd))) is kept_by("ops" + str(len(odd)))
    assert kept_by(7) == 7
