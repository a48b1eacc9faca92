"""``calendars:`` (sidecar/config/calendars.py): files and dates read, ``calendar:<name>``
resolved in a job's ``exclude``, every bad input a config error naming its key."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.admin.jobcheck import parse_bucket_job
from sidecar.config.calendars import MAX_CALENDAR_FILE
from sidecar.config.load import ConfigError, load_config, parse_config
from sidecar.store.digests import job_hash
from tests.support import run_cli

HOLIDAYS = (
    "BEGIN:VCALENDAR\r\nVERSION:2.0\r\n"
    "BEGIN:VEVENT\r\nDTSTART;VALUE=DATE:20261225\r\nDTEND;VALUE=DATE:20261227\r\nEND:VEVENT\r\n"
    "BEGIN:VEVENT\r\nDTSTART;VALUE=DATE:20260501\r\nRRULE:FREQ=YEARLY\r\nEND:VEVENT\r\n"
    "END:VCALENDAR\r\n"
)


def config_of(calendars: object, exclude: list[Any], base: Path | None = None) -> Any:
    data = {
        "calendars": calendars,
        "jobs": [{"name": "report", "schedule": "0 9 * * *", "exclude": exclude}],
    }
    return parse_config(data, {}, str(base) if base else None)


def test_a_file_is_read_from_the_config_files_directory(tmp_path: Path) -> None:
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "holidays.ics").write_text(HOLIDAYS, newline="")
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "calendars": {"holidays-de": {"file": "cal/holidays.ics"}},
                "jobs": [
                    {
                        "name": "report",
                        "schedule": "0 9 * * *",
                        "timezone": "Europe/Berlin",
                        "exclude": ["2026-12-28", "calendar:holidays-de"],
                    }
                ],
            }
        )
    )
    config = load_config(str(cfg), {})  # whatever the working directory is
    (job,) = config.jobs
    assert [s.name for s in job.schedule.shared] == ["holidays-de"]
    assert [e.text for e in job.schedule.exclusions] == ["2026-12-28"]
    found = job.schedule.excluded(1_798_185_600_000)  # 2026-12-25T09:00+01:00
    assert found is not None and found.text == "calendar:holidays-de 2026-12-25/2026-12-27"
    assert config.calendars["holidays-de"].source == "file cal/holidays.ics"


def test_dates_take_what_exclude_takes_and_mix_with_plain_entries() -> None:
    config = config_of(
        {"freeze": {"dates": ["2026-12-24", "2026-12-31T22:00:00+01:00/PT8H"]}},
        ["calendar:freeze", "2026-12-28", " calendar:freeze "],  # named twice: once
    )
    cal = config.jobs[0].schedule
    assert len(cal.shared) == 1 and len(cal.shared[0]) == 2
    runs = cal.runs(1_798_070_400_000, 3)  # from 2026-12-24T00:00Z
    assert runs == [1_798_102_800_000 + d * 86_400_000 for d in (1, 2, 3)]  # 25th..27th
    # unquoted dates are YAML dates: the same days
    assert config_of({"f": {"dates": yaml.safe_load("[2026-12-24]")}}, ["calendar:f"]).calendars[
        "f"
    ].entries == ("2026-12-24",)


@pytest.mark.parametrize(
    ("calendars", "exclude", "key", "says"),
    [
        (
            {"h": {"dates": ["2026-12-24"]}},
            ["2026-12-24", "calendar:hx"],
            "jobs[0].exclude[1]",
            "unknown calendar 'hx' (calendars: h)",
        ),
        (None, ["calendar:h"], "jobs[0].exclude[0]", "unknown calendar 'h' (calendars: none)"),
        (
            {"h": {"dates": ["2026-12-24", "2026-13-01"]}},
            [],
            "calendars.h.dates[1]",
            "'2026-13-01' is not a date",
        ),
        (
            {"h": {"dates": ["2026-12-24/2026-12-23"]}},
            [],
            "calendars.h.dates[0]",
            "ends before it starts",
        ),
        ({"h": {"dates": "2026-12-24"}}, [], "calendars.h.dates", "expected a list"),
        ({"h": {"dates": [20261224]}}, [], "calendars.h.dates[0]", "expected a string"),
        ({"h": {"file": "h.ics", "dates": []}}, [], "calendars.h", "either file"),
        ({"h": {}}, [], "calendars.h", "either file"),
        ({"h": {"url": "x"}}, [], "calendars.h.url", ""),
        ({"h w": {"dates": []}}, [], "calendars.'h w'", "letters, digits"),
        (["h"], [], "calendars", "expected a map"),
        ({"h": {"file": "absent.ics"}}, [], "calendars.h.file", "absent.ics: no such file"),
        ({"h": {"file": ""}}, [], "calendars.h.file", "must not be empty"),
    ],
)
def test_bad_calendars_name_their_key(
    calendars: object, exclude: list[Any], key: str, says: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_of(calendars, exclude, tmp_path)
    assert caught.value.key == key
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (HOLIDAYS.replace("20260501", "20260532"), "h.ics, line 8: '20260532' is not a date"),
        (HOLIDAYS.replace("YEARLY", "MONTHLY"), "h.ics, line 9: RRULE FREQ=MONTHLY: only"),
        ("not a calendar\n", "h.ics, line 1: not an iCalendar file"),
        (b"BEGIN:VCALENDAR\r\n\xff\r\n", "h.ics: not UTF-8 text (byte 17)"),
        (b"x" * (MAX_CALENDAR_FILE + 1), "larger than 1 MiB"),
    ],
)
def test_a_file_that_does_not_parse_names_the_file_and_line(
    content: str | bytes, says: str, tmp_path: Path
) -> None:
    path = tmp_path / "h.ics"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as caught:
        config_of({"h": {"file": "h.ics"}}, ["calendar:h"], tmp_path)
    assert caught.value.key == "calendars.h.file"
    assert says in str(caught.value)


def test_the_jobs_hash_covers_the_calendars_content(tmp_path: Path) -> None:
    def hashed(dates: list[str], exclude: list[str]) -> str:
        return job_hash(config_of({"h": {"dates": dates}}, exclude).jobs[0])

    one = hashed(["2026-12-24"], ["calendar:h"])
    assert hashed(["2026-12-24"], ["calendar:h"]) == one
    assert hashed(["2026-12-25"], ["calendar:h"]) != one  # another content: "settings differ"
    assert hashed(["2026-12-25"], []) == hashed(["2026-12-24"], [])  # unused: no change
    plain = parse_config({"jobs": [{"name": "report", "schedule": "0 9 * * *"}]}, {})
    assert hashed(["2026-12-24"], []) == job_hash(plain.jobs[0])  # as before calendars


def test_a_bucket_job_names_the_configs_calendars() -> None:
    config = config_of({"h": {"dates": ["2026-12-24"]}}, [])
    job = parse_bucket_job(
        config, {"name": "b", "schedule": "0 9 * * *", "exclude": ["calendar:h"]}, "job"
    ).job
    assert [s.name for s in job.schedule.shared] == ["h"]
    with pytest.raises(ConfigError, match=r"job\.exclude\[0\]: unknown calendar 'x'"):
        parse_bucket_job(
            config, {"name": "b", "schedule": "* * * * *", "exclude": ["calendar:x"]}, "job"
        )


def test_check_names_the_calendars_and_applies_them(tmp_path: Path) -> None:
    (tmp_path / "h.ics").write_text(HOLIDAYS, newline="")
    years = [str(time.gmtime().tm_year + k) for k in (0, 1)]  # this year and the next
    days = [f"{y}-{m:02d}-{d:02d}" for y in years for m in range(1, 13) for d in range(1, 29)]
    data: dict[str, Any] = {
        "instance_id": "web-1",
        "calendars": {"h": {"file": "h.ics"}, "every-day": {"dates": days}},
        "jobs": [
            {"name": "report", "schedule": "0 9 * * *", "exclude": ["calendar:h"]},
            {"name": "closed", "schedule": "0 9 * * *", "exclude": ["calendar:every-day"]},
        ],
    }
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    good = run_cli("check", "-c", str(cfg))
    assert good.returncode == 0, good.stderr
    out = good.stdout
    assert "calendar h: file h.ics, 2 entries, content hash " in out
    assert "  excluded: calendar:h (2 entries, content hash " in out
    closed = out.split("closed:")[1].splitlines()
    nexts = [line for line in closed if line.startswith("  next: ")]
    # no day 1..28 of this year or the next: each next run is on a 29th..31st
    assert nexts and all(line.split()[1][:4] in years for line in nexts), nexts
    assert all(line.split()[1][-2:] in ("29", "30", "31") for line in nexts), nexts
    data["jobs"][1]["exclude"] = ["calendar:everyday"]
    cfg.write_text(yaml.safe_dump(data))
    bad = run_cli("check", "-c", str(cfg))
    assert bad.returncode == 2, bad
    assert "config error: jobs[1].exclude[0]: unknown calendar 'everyday'" in bad.stderr
    assert "Traceback" not in bad.stderr
    (tmp_path / "h.ics").write_text(
        HOLIDAYS.replace("DTSTART;VALUE=DATE:20261225", "DTSTART;VALUE=DATE:2026-12-25")
    )
    bad = run_cli("check", "-c", str(cfg), "--no-files")  # calendars decide slots: read anyway
    assert bad.returncode == 2, bad
    assert f"config error: calendars.h.file: {tmp_path / 'h.ics'}, line 4: " in bad.stderr
    assert "Traceback" not in bad.stderr
