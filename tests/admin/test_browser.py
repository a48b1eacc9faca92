"""The fleet page in a real headless Chromium, against real sidecars and a real nats-server.

The jobs and their runs appear; a run appears live without a reload; a
pause made with the token through the page's form stops the job on every
replica; the same POST without the token is refused; the console has no
error (a CSP violation would be one); issue 42's features show in the rows (a
bucket job's tag and id, an interval in words, overlap and its kept slot, a
pending one-off, not started, max_runs); a stream leader named by its 56-character
server id stays in its own box at four widths (issue 51). Screenshots at a phone's
and a desktop's width are written to ``$PAGE_SCREENSHOTS`` (default build/screenshots/).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.browser import chromium, chromium_or_skip
from tests.fleet.test_fleet import base, cli_config, job, slots
from tests.support import ROOT, NatsServer, RecordingApp, run_cli, sidecars, wait_for

TOKEN = "alice-token-0123456789abcdef"
SHOTS = Path(os.environ.get("PAGE_SCREENSHOTS") or ROOT / "build" / "screenshots")


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


ROWS = "document.querySelectorAll('#jobs-body tr').length"
ROW = "document.getElementById('job-{job}').innerText"
NEXT_RUNS = "document.querySelector('#job-{job} td[data-label=\"next runs\"]').innerText"
# The Duration column of the job page's runs, and how many lines each run id takes.
# Each run's status and duration cells, as shown.
DURATIONS = (
    "Array.from(document.querySelectorAll('#runs-body tr'))"
    ".map(r => [r.children[0].innerText.trim(), r.children[7].innerText])"
)
# For each run id and fence (the last two columns): 1 when it is one line box and its
# copy button sits on that line.
ID_LINES = (
    "Array.from(document.querySelectorAll('#runs-body td:nth-child(n+11)')).map(td => {"
    " const code = td.querySelector('code'), b = td.querySelector('button');"
    " const r = code.getBoundingClientRect(), m = b ? b.getBoundingClientRect() : r;"
    " const mid = (m.top + m.bottom) / 2;"
    " return code.getClientRects().length + (mid >= r.top && mid <= r.bottom ? 0 : 1); })"
)


def in_days(days: int) -> str:
    """An RFC 3339 instant `days` from now, to the second."""
    return (datetime.now(UTC) + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def marks(job_name: str) -> str:
    return f"document.querySelectorAll('#job-{job_name} .strip .mark').length"


async def test_the_page_in_chromium(
    tmp_path: Path, nats_server: NatsServer, http_app: RecordingApp
) -> None:
    binary = chromium_or_skip()
    token_file = tmp_path / "tokens"
    token_file.write_text(f"alice:{TOKEN}\n")
    http_app.status["/jobs/report"] = 500
    jobs: list[dict[str, Any]] = [
        job("sync", schedule="*/2 * * * * *"),
        job("report", schedule="*/3 * * * * *"),
        job("backup", schedule="0 3 * * *"),
        job("nightly-export", schedule="30 2 * * 1-5", timezone="Europe/Berlin"),
        # Issue 42: an interval with a cap, a job not started yet, buffer_one.
        {"name": "invoices", "schedule": "@every 90m offset 15m", "max_runs": 500},
        {"name": "launch", "schedule": "0 9 * * *", "start_at": in_days(30)},
        job("reindex", schedule="*/2 * * * * *", overlap="buffer_one", max_late="10s"),
    ]
    http_app.delay["/jobs/reindex"] = 4.0
    config = base(nats_server, http_app, jobs)
    config["admin"] = {"token_file": str(token_file)}
    cfg = cli_config(tmp_path, config)
    with sidecars(tmp_path, [(f"web-{i}", config, {}) for i in range(1, 4)]) as procs:
        spec = tmp_path / "tenant.json"
        spec.write_text(
            json.dumps({"name": "tenant-sync", "schedule": "0 */6 * * *", "id": "tenant-7/sync"})
        )
        assert run_cli("job", "add", str(spec), "-c", cfg).returncode == 0
        done = run_cli("at", "backup", "2h", "-c", cfg, "--reason", "restore drill")
        assert done.returncode == 0, done.stderr
        wait_for(lambda: len(slots(http_app, "/jobs/sync")) >= 3, 30, what="runs of sync")
        wait_for(lambda: len(slots(http_app, "/jobs/report")) >= 2, 30, what="runs of report")
        url = procs[0].base_url
        async with chromium(binary) as page:
            await page.size(1440, 900, mobile=False)
            # A viewer far from the schedules' zones: a job's times stay in its own.
            await page.send("Emulation.setTimezoneOverride", timezoneId="America/New_York")
            await page.goto(url + "/")
            await page.until(f"{ROWS} === 8", what="every job, the bucket's too")
            berlin = await page.js(NEXT_RUNS.format(job="nightly-export"))
            # Berlin's offset either side of the summer-time change (not New York's).
            berlin_zone = ("GMT+1", "GMT+2", "CET", "CEST")
            assert "02:30:00" in berlin and any(z in berlin for z in berlin_zone), berlin
            utc = await page.js(NEXT_RUNS.format(job="backup"))
            assert "03:00:00" in utc and "UTC" in utc, utc
            await page.until(f"{marks('sync')} >= 2", what="sync's runs in its strip")
            # Marks say what they mean in words, not colour alone.
            label = await page.js(
                "document.querySelector('#job-report .mark.bad').getAttribute('aria-label')"
            )
            assert label.startswith("failed"), label
            assert (
                int(await page.js("document.querySelector('#job-report td.num').textContent")) >= 2
            )
            assert "03:00" in await page.js("document.getElementById('job-backup').innerText")
            # Live: a manual run made elsewhere shows without a reload.
            await page.until("document.getElementById('live').textContent === 'live'")
            await page.js("window.notReloaded = 1")
            assert await page.js(marks("backup")) == 0
            started = time.monotonic()
            code = post(
                procs[1].base_url + "/api/v1/jobs/backup/run-now",
                b"",
                {"Authorization": f"Bearer {TOKEN}"},
            )
            assert code == 200
            await page.until(f"{marks('backup')} >= 1", 10, what="the manual run, live")
            appeared = time.monotonic() - started
            assert await page.js("window.notReloaded") == 1
            print(f"\na manual run showed on the page {appeared:.2f}s after the POST")
            assert appeared < 5, appeared
            await page.until("document.querySelector('#job-backup .mark.ok') !== null", 10)
            # Issue 42 in the rows, read as a person reads them.
            tenant = await page.js(ROW.format(job="tenant-sync"))
            assert "bucket" in tenant and "id tenant-7/sync" in tenant, tenant
            invoices = await page.js(ROW.format(job="invoices"))
            assert "Every 90m, counted from the Unix epoch + 15m" in invoices, invoices
            # One of its 16 slots a day may fall while the test runs.
            assert re.search(r"\b[01] of max_runs 500 runs", invoices), invoices
            launch = await page.js(ROW.format(job="launch"))
            assert "not started" in launch and "(start_at)" in launch, launch
            assert "once" in await page.js(ROW.format(job="backup"))
            await page.until(
                f"{ROW.format(job='reindex')}.includes('runs after the running one')",
                20,
                what="reindex's kept slot, live",
            )
            assert "overlap: buffer_one" in await page.js(ROW.format(job="reindex"))
            await page.screenshot(SHOTS / "fleet-desktop.png")
            await page.size(390, 844, mobile=True)
            await page.goto(url + "/")
            await page.until(f"{marks('sync')} >= 2")
            await page.screenshot(SHOTS / "fleet-phone.png")
            assert await page.js("document.documentElement.scrollWidth <= 400")
            # Dark by the system's setting.
            await page.send(
                "Emulation.setEmulatedMedia",
                features=[{"name": "prefers-color-scheme", "value": "dark"}],
            )
            background = await page.js("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(21, 24, 27)", background
            await page.screenshot(SHOTS / "fleet-phone-dark.png")
            await page.send("Emulation.setEmulatedMedia", features=[])
            # Sign in with the token, then pause through the job page's form.
            await page.size(1440, 900, mobile=False)
            await page.js(
                "document.getElementById('token').value = "
                + json.dumps(TOKEN)
                + "; document.querySelector('form.login').requestSubmit()"
            )
            await page.wait_event("Page.loadEventFired")
            session = await page.js("document.querySelector('.session').textContent")
            assert "signed in as alice" in session, session
            await page.goto(url + "/jobs/sync")
            # A run of a few ms reads in ms; a run id stays on one line with its button.
            cells = await page.js(DURATIONS)
            # A run still going (the newest, loaded mid-run) has no duration yet: a dash.
            durations = [d for status, d in cells if not status.endswith("running")]
            assert all(d == "\u2013" for status, d in cells if status.endswith("running")), cells
            assert any(d.endswith(" ms") for d in durations), cells
            assert all(re.fullmatch(r"\d+ ms|\d+\.\d s", d) for d in durations), cells
            assert "0.0 s" not in durations, cells
            lines = await page.js(ID_LINES)
            assert lines and set(lines) == {1}, lines
            csrf = await page.js("document.querySelector('input[name=csrf]').value")
            # The same POST without the token (no session cookie) is refused.
            form = f"csrf={csrf}&reason=x".encode()
            plain = {"Content-Type": "application/x-www-form-urlencoded"}
            assert post(url + "/jobs/sync/pause", form, plain) == 401
            assert post(url + "/api/v1/jobs/sync/pause", form, plain) == 401
            await page.js(
                "document.getElementById('reason').value = 'page test';"
                "document.querySelector('form.pause').requestSubmit()"
            )
            await page.wait_event("Page.loadEventFired")
            paused_at = time.time()
            wait_for(
                lambda: all(p.metric("anarchon_job_paused", {"job": "sync"}) == 1 for p in procs),
                5,
                what="sync paused on every replica",
            )
            body = await page.js("document.body.innerText")
            assert "paused" in body and "page test" in body
            await page.until(
                "document.querySelector('#acts-body').innerText.includes('alice')",
                5,
                what="the pause in the job's actions",
            )
            # Skip through the job page's form (CSRF like the others): shown as pending.
            await page.js(
                "document.getElementById('count').value = '3';"
                "document.querySelector('form.skip').requestSubmit()"
            )
            await page.wait_event("Page.loadEventFired")
            await page.until(
                "document.querySelector('#acts-body').innerText.includes('skip')",
                5,
                what="the skip in the job's actions",
            )
            assert "run(s) skipped" in await page.js("document.body.innerText")
            # Run ids and fences are copyable; the keyboard reaches the content first.
            assert (
                await page.js("document.querySelectorAll('#runs-body button.copy-btn').length") >= 2
            )
            await page.send("Input.dispatchKeyEvent", type="keyDown", key="Tab", code="Tab")
            await page.send("Input.dispatchKeyEvent", type="keyUp", key="Tab", code="Tab")
            assert await page.js("document.activeElement.className") == "skip-link"
            await page.screenshot(SHOTS / "job-desktop.png")
            # A bucket job's own page says where it comes from, with its pending one-off.
            await page.goto(url + "/jobs/tenant-sync")
            source = await page.js("document.querySelector('p.src').innerText")
            assert "state bucket key job.tenant-sync, id tenant-7/sync" in source, source
            await page.screenshot(SHOTS / "job-bucket-desktop.png")
            await asyncio.sleep(4)
            late = [s for s in slots(http_app, "/jobs/sync") if s / 1000 > paused_at + 1]
            assert late == [], "sync ran after the pause"
            assert page.errors == [], page.errors
    for name in (
        "fleet-desktop.png",
        "fleet-phone.png",
        "job-desktop.png",
        "job-bucket-desktop.png",
    ):
        assert (SHOTS / name).stat().st_size > 10_000, name


class UnnamedServer(NatsServer):
    """A nats-server started as a newcomer starts it: no ``server_name``, so its name
    (and the stream's leader the page shows) is its 56-character server id."""

    def config_text(self) -> str:
        return "".join(
            line
            for line in super().config_text().splitlines(keepends=True)
            if not line.startswith("server_name:")
        )


# Every <dd> of the fleet section's Stream and State bucket boxes: the rectangles of its
# text (not of its box: a word too long for it spills out of a box that fits), its cell's,
# and those of the other cell's labels (h3, dt), as [left, right, top, bottom].
FLEET_BOXES = """(() => {
  const rect = r => [r.left, r.right, r.top, r.bottom];
  const cells = Array.from(document.querySelectorAll('#fleet .cols > div'));
  return cells.flatMap((cell, i) => Array.from(cell.querySelectorAll('dd')).map(dd => {
    const range = document.createRange();
    range.selectNodeContents(dd);
    const others = cells.filter((_, j) => j !== i);
    return {
      label: dd.previousElementSibling.textContent,
      text: dd.textContent,
      spans: Array.from(range.getClientRects()).map(rect),
      cell: rect(cell.getBoundingClientRect()),
      labels: others.flatMap(o => Array.from(o.querySelectorAll('h3, dt')))
        .map(l => rect(l.getBoundingClientRect())),
    };
  }));
})()"""


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


async def test_a_long_stream_leader_stays_in_its_own_box(
    tmp_path: Path, http_app: RecordingApp
) -> None:
    """Issue 51: the leader's id ran over the State bucket box and covered its labels."""
    binary = chromium_or_skip()
    server = UnnamedServer(tmp_path / "nats")
    server.start()
    seen: dict[int, list[dict[str, Any]]] = {}
    wide: dict[int, int] = {}
    try:
        config = base(server, http_app, [job("backup", schedule="0 3 * * *")])
        with sidecars(tmp_path, [("web-1", config, {})]) as (proc,):
            # A job added at run time: the State bucket box gets a fourth line, level
            # with the leader's.
            spec = tmp_path / "tenant.json"
            spec.write_text(json.dumps({"name": "tenant-sync", "schedule": "0 */6 * * *"}))
            added = run_cli("job", "add", str(spec), "-c", cli_config(tmp_path, config))
            assert added.returncode == 0, added.stderr
            async with chromium(binary) as page:
                # A desktop, a laptop, Chromium's own default window and a phone.
                for width, height, mobile in (
                    (1440, 900, False),
                    (1280, 800, False),
                    (800, 600, False),
                    (390, 844, True),
                ):
                    await page.size(width, height, mobile=mobile)
                    await page.goto(proc.base_url + "/")
                    await page.until(
                        "(document.querySelector('#fleet') || {}).innerText"
                        "?.includes('jobs added at run time')",
                        what="the fleet section's boxes, the bucket job counted",
                    )
                    seen[width] = await page.js(FLEET_BOXES)
                    wide[width] = await page.js("document.documentElement.scrollWidth")
                    await page.screenshot(SHOTS / f"fleet-long-leader-{width}.png")
                assert page.errors == [], page.errors
    finally:
        server.stop()
    for width, boxes in seen.items():
        leader = next(b for b in boxes if b["label"] == "leader")
        assert len(leader["text"]) == 56 and " " not in leader["text"], leader
        for box in boxes:
            cell = box["cell"]
            for span in box["spans"]:
                # Within its own box, and over none of the other box's labels.
                assert cell[0] - 0.5 <= span[0] and span[1] <= cell[1] + 0.5, (width, box)
                assert not any(overlaps(span, label) for label in box["labels"]), (width, box)
        assert wide[width] <= width, (width, wide[width])  # no sideways scrolling
