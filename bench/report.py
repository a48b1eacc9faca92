"""The table of every benchmark's figures and ratios, and the start-delay picture.

``python -m bench.report`` reads ``bench/results/*.json`` and prints a
Markdown table; with matplotlib installed it draws the start-delay
distribution to ``bench/results/start-delay.png``. ``--write`` also puts the
machine and the table into docs/PERFORMANCE.md (between its ``bench:begin``
and ``bench:end`` markers) and the picture into docs/start-delay.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.common import RESULTS, ROOT, read_result

DOC = ROOT / "docs" / "PERFORMANCE.md"
DOC_PNG = ROOT / "docs" / "start-delay.png"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if value < 10 else f"{value:.0f} ms"


def fleet_keys(fleet: dict[str, Any]) -> list[str]:
    """The fleet runs, fewest instances first."""
    return sorted((k for k in fleet if k.startswith("fleet_")), key=lambda k: fleet[k]["instances"])


def rows() -> list[tuple[str, str, str, str, str]]:
    """(figure, sidecar, baseline, ratio, target) rows."""
    out: list[tuple[str, str, str, str, str]] = []
    claim = read_result("claim_latency")
    if claim:
        w, r, lo, rl = claim["won"], claim["raw"], claim["lost"], claim["raw_lost"]
        out += [
            (
                "Claim decision, won, p50",
                _ms(w["p50_ms"]),
                f"{_ms(r['p50_ms'])} raw js.publish + msg id",
                f"{claim['ratio_p50']:.2f}x",
                "<= 1.15x",
            ),
            (
                "Claim decision, won, p99",
                _ms(w["p99_ms"]),
                _ms(r["p99_ms"]),
                f"{claim['ratio_p99']:.2f}x",
                "",
            ),
            (
                "Claim decision, lost, p50",
                _ms(lo["p50_ms"]),
                f"{_ms(rl['p50_ms'])} raw publish of a stored msg id",
                f"{claim['lost_ratio_p50']:.2f}x",
                "",
            ),
            (
                "Claim decision, lost, p99",
                _ms(lo["p99_ms"]),
                _ms(rl["p99_ms"]),
                f"{claim['lost_ratio_p99']:.2f}x",
                "",
            ),
        ]
    leases = read_result("leases")
    if leases:
        plain, reqs = leases["plain"], leases["requests_per_run"]
        for kind, what in (("run", "run.<job>.<slot>"), ("lock", "lock.<job>, overlap: skip")):
            out.append(
                (
                    f"Claim to trigger with a lease ({what}), p50",
                    f"{_ms(leases[kind]['p50_ms'])} ({reqs[kind][0]} requests a run)",
                    f"{_ms(plain['p50_ms'])} claim only ({reqs['plain'][0]} request)",
                    f"{leases[f'{kind}_ratio_p50']:.2f}x",
                    "",
                )
            )
    fleet = read_result("fleet")
    if fleet:
        raw = fleet["raw"]
        for key in fleet_keys(fleet):
            run = fleet[key]
            n, j = run["instances"], run["jobs"]
            out.append(
                (
                    f"Fleet {n} x {j} jobs/s: slots run per second",
                    f"{run['slots_per_second']:.1f} ({run['claims_per_second']:.0f} claims/s, "
                    f"{run['doubles']} doubles)",
                    f"{raw['publishes_per_second']:.0f} publishes/s, one raw client, "
                    f"{raw['concurrency']} at a time",
                    "",
                    f"{j}/s, 0 doubles",
                )
            )
            out.append(
                (
                    f"Fleet {n} x {j}: CPU per slot per instance",
                    f"{run['cpu_ms_per_slot_per_instance']:.3f} ms",
                    f"{raw['cpu_ms_per_publish']:.3f} ms per raw publish",
                    f"{run['cpu_ratio_vs_raw_publish']:.1f}x",
                    "<= 3.5x" if n == 3 else "",
                )
            )
        for key in ["idle", *fleet_keys(fleet)]:
            run = fleet.get(key, {})
            if "js_requests_per_slot" in run:
                n = run["instances"]
                out.append(
                    (
                        f"JetStream requests per slot, {n} replicas x {run['jobs']} jobs",
                        f"{run['js_requests_per_slot']:.2f}",
                        "claims + stored-claim reads + results, counted on the server",
                        "",
                        f"N + 1 = {n + 1}",
                    )
                )
        for key, label in [("idle", "idle (3 x 1 job)")] + [
            (k, f"under fleet {fleet[k]['instances']} x {fleet[k]['jobs']}")
            for k in fleet_keys(fleet)
        ]:
            if key not in fleet:
                continue
            d = fleet[key]["start_delay"]
            raw_d = fleet[key].get("raw_publish_and_post")
            if raw_d and raw_d.get("n"):
                for q in ("p50", "p99"):
                    out.append(
                        (
                            f"Start delay {label}, {q}",
                            _ms(d[f"{q}_ms"]) + f" (n={d['n']})",
                            f"{_ms(raw_d[f'{q}_ms'])} raw publish + raw POST (n={raw_d['n']})",
                            f"{d[f'{q}_ms'] / raw_d[f'{q}_ms']:.2f}x",
                            "<= 2.5x" if q == "p50" else "<= 5x",
                        )
                    )
                continue
            out.append(
                (
                    f"Start delay {label}, p50 / p99 / max",
                    f"{_ms(d['p50_ms'])} / {_ms(d['p99_ms'])} / {_ms(d['max_ms'])} (n={d['n']})",
                    "",
                    "",
                    "p99 <= 25 ms" if fleet[key]["instances"] == 3 else "",
                )
            )
    fp = read_result("footprint")
    if fp:
        base = fp["floor"]
        for key in sorted((k for k in fp if k.startswith("jobs_")), key=lambda k: int(k[5:])):
            m = fp[key]
            n = int(key[5:])
            out.append(
                (
                    f"RSS with {n} jobs",
                    f"{m['rss_mib']:.1f} MiB (+{m['rss_above_floor_mib']:.1f})",
                    f"{base['rss_mib']:.1f} MiB Python + nats-py, PyYAML, click, prometheus-client",
                    f"{m['rss_mib'] / base['rss_mib']:.2f}x",
                    {100: "<= 1.12x", 1000: "<= 1.25x"}.get(n, ""),
                )
            )
            out.append(
                (
                    f"Time to ready with {n} jobs",
                    f"{m['seconds'] * 1000:.0f} ms",
                    f"{base['seconds'] * 1000:.0f} ms importing the dependencies",
                    f"{m['ready_ratio_vs_import']:.1f}x",
                    "<= 0.3 s" if n == 1000 else "< 1 s",
                )
            )
    hist = read_result("history")
    if hist:
        ip, cli = hist["in_process"]["median_ms"], hist["cli"]["median_ms"]
        out.append(
            (
                f"History of {hist['runs']} runs, read_history",
                _ms(ip["sidecar"]),
                f"{_ms(ip['raw'])} raw ordered consumer",
                f"{ip['ratio']:.2f}x",
                "<= 1.2x",
            )
        )
        out.append(
            (
                f"History of {hist['runs']} runs, `history --json` process",
                _ms(cli["sidecar"]),
                f"{_ms(cli['raw'])} nats-py process, same read",
                f"{cli['ratio']:.2f}x",
                "",
            )
        )
    return out


def table() -> str:
    lines = [
        "| figure | sidecar | baseline (same run) | ratio | target |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows()]
    return "\n".join(lines)


def capacity_table() -> str:
    """The capacity runs (bench.capacity), when there are any."""
    cap = read_result("capacity")
    if not cap:
        return ""
    lines = [
        f"Capacity (`python -m bench.capacity`, every job every second at jitter 0, "
        f"{cap['window_seconds']} s windows; holds: start delay p99 <= {cap['limit_ms']:.0f} ms, "
        "no slot missed or doubled):",
        "",
        "| NATS | replicas | jobs/s | start delay p50 / p99 | slots | CPU/slot/instance | holds |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, name in (("single", "1 server, R1"), ("r3", "3-node cluster, R3")):
        for r in cap.get(key, []):
            lines.append(
                f"| {name} | {r['replicas']} | {r['jobs_per_second']} | "
                f"{_ms(r['p50_ms'] or 0)} / {_ms(r['p99_ms'] or 0)} | "
                f"{r['slots']}/{r['slots_expected']} ({r['doubles']} doubles) | "
                f"{r['cpu_ms_per_slot_per_instance']:.3f} ms | {'yes' if r['held'] else 'no'} |"
            )
    return "\n".join(lines)


def machine_line() -> str:
    for name in ("fleet", "claim_latency", "footprint", "history"):
        data = read_result(name)
        if data and "machine" in data:
            m: dict[str, Any] = data["machine"]
            return (
                f"{m['cores']} cores ({m['cpu_model']}), Python {m['python']}, "
                f"nats-server {m['nats_server']}, nats-py {m['nats_py']}, h11 {m.get('h11', '?')}; "
                "sidecars and baselines in a runtime-only venv (`pip install .`, no aiohttp)"
            )
    return "no results yet"


def picture(path: Path) -> bool:
    """The start-delay distribution (idle and under load) as a PNG; False without matplotlib."""
    fleet = read_result("fleet")
    if not fleet:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = [(k, fleet[k]) for k in ["idle", *fleet_keys(fleet)] if k in fleet]
    series = [(k, v) for k, v in series if v["start_delays_ms"]]
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.6), squeeze=False)
    for ax, (key, run) in zip(axes[0], series, strict=True):
        delays = run["start_delays_ms"]
        d = run["start_delay"]
        label = (
            "idle: 3 sidecars x 1 job"
            if key == "idle"
            else (f"{run['instances']} sidecars x {run['jobs']} jobs")
        )
        ax.hist(delays, bins=40, color="#3b6ea5")
        for q, style in (("p50_ms", "-"), ("p99_ms", "--")):
            ax.axvline(d[q], color="#c0392b", linestyle=style, linewidth=1)
        ax.set_title(f"{label}\np50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms", fontsize=9)
        ax.set_xlabel("slot time to request at the app (ms)", fontsize=8)
        ax.set_ylabel("requests", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("Trigger start delay (jitter 0; red: p50 solid, p99 dashed)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------ scale (bench.scale)

SCALE_BEGIN, SCALE_END = "<!-- scale:begin -->", "<!-- scale:end -->"
SWEEPS = (
    ("fleet", "instances", "sidecars N (100 jobs each)", "scale-fleet.png"),
    ("jobs", "jobs", "jobs J per sidecar (2 sidecars)", "scale-jobs.png"),
)


def sweep(scale: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The points of one sweep: N at 100 jobs, or J at 2 sidecars; the crossing in both."""
    pts = [p for p in scale.get("points", []) if "failed" not in p]
    if kind == "fleet":
        return sorted((p for p in pts if p["jobs"] == 100), key=lambda p: p["instances"])
    return sorted((p for p in pts if p["instances"] == 2), key=lambda p: p["jobs"])


def scale_table(points: list[dict[str, Any]]) -> str:
    lines = [
        "| N x J | slots (doubles) | JS requests / slot | server CPU / slot "
        "| server msgs / slot (without the counter's) "
        "| sidecar CPU / slot (marginal) | sidecar idle CPU | wake-ups/s idle | RSS "
        "| start delay p50 / p99 | ready: joining / N-1 at once (max) | machine busy / load "
        "| raw publishes/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        d = p["start_delay"]
        lines.append(
            f"| {p['instances']} x {p['jobs']} | {p['slots']}/{p['slots_expected']} "
            f"({p['doubles']}) | {p['js_requests_per_slot']:.2f} "
            f"| {p['server_cpu_ms_per_slot']:.3f} ms "
            f"| {p['server_msgs_per_slot'] - p['js_requests_per_slot']:.0f} "
            f"| {p['cpu_ms_per_slot_mean']:.3f} ms ({p['cpu_ms_per_slot_marginal']:.3f}) "
            f"| {p['idle_cpu_percent_mean']:.2f}% (max {p['idle_cpu_percent_max']:.2f}%) "
            f"| {p['idle_wakeups_per_second']:.1f} | {p['rss_mib_mean']:.1f} MiB "
            f"| {_ms(d.get('p50_ms', 0))} / {_ms(d.get('p99_ms', 0))} "
            f"| {p['ready_alone_s']:.2f} s / {p['ready_together_max_s']:.1f} s "
            f"| {100 * p['busy']['machine_busy']:.0f}% / {p['busy']['loadavg_1m']:.1f} "
            f"| {p['raw']['publishes_per_second']:.0f} |"
        )
    return "\n".join(lines)


def variants_table(v: dict[str, Any]) -> str:
    names = [n for n in ("asyncio", "uvloop", "py3.14", "py3.13", "py3.12") if n in v]
    if not names:
        return ""
    lines = [
        f"Variants side by side (`bench.scale`, {v['rounds']} interleaved rounds each; fleet 3 x "
        f"100 jobs every second at jitter 0, {v['window_seconds']} s windows; footprint with "
        "1,000 jobs; raw publish "
        f"{v['raw']['cpu_ms_per_publish']:.3f} CPU ms):",
        "",
        "| variant | CPU / slot / instance (vs raw publish) | vs asyncio | start delay p50 / p99 "
        "| p99 vs asyncio | ready, 1,000 jobs | RSS, 1,000 jobs (vs its floor) | slots (doubles) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in names:
        r = v[n]
        lines.append(
            f"| {n}: {r['what']} | {r['cpu_ms_per_slot_per_instance_median']:.3f} ms "
            f"({r['cpu_ratio_vs_raw_publish']:.1f}x) | {r.get('cpu_vs_asyncio', 1):.2f}x "
            f"| {_ms(r['start_delay_p50_ms'])} / {_ms(r['start_delay_p99_ms'])} "
            f"| {r.get('p99_vs_asyncio', 1):.2f}x | {r['ready_1000_s'] * 1000:.0f} ms "
            f"({r.get('ready_vs_asyncio', 1):.2f}x) | {r['rss_1000_mib']:.1f} MiB "
            f"({r['rss_ratio_vs_floor']:.2f}x) | {r['slots']}/{r['slots_expected']} "
            f"({r['doubles']}) |"
        )
    for n, why in v.get("skipped", {}).items():
        lines.append(f"| {n} | not measured: {why} | | | | | | |")
    return "\n".join(lines)


def scale_block(png_dir: Path) -> str:
    scale = read_result("scale")
    if not scale:
        return ""
    out = []
    m = scale.get("machine", {})
    if m:
        out.append(
            f"Measured on {m['cores']} cores ({m['cpu_model']}), Python {m['python']}, "
            f"nats-server {m['nats_server']}, nats-py {m['nats_py']}; the run's measuring took "
            f"{scale.get('minutes', 0):.0f} min."
        )
    idle = scale.get("idle_1000")
    if idle:
        out.append(
            f"\nIdle cost: one sidecar with {idle['jobs']:,} jobs, none due, over "
            f"{idle['seconds']:.0f} s: **{idle['cpu_percent_of_a_core']:.3f}% of a core**, "
            f"**{idle['wakeups_per_second']:.1f} wake-ups a second** (context switches), RSS "
            f"{idle['rss_mib']:.1f} MiB (machine {100 * idle['machine_busy']:.0f}% busy with "
            f"other work, load average {idle['loadavg_1m']:.1f})."
        )
    for kind, _, _, png in SWEEPS:
        points = sweep(scale, kind)
        if points:
            out.append(f"\n![{kind} sweep]({png})\n\n{scale_table(points)}")
    for p in scale.get("points", []):
        if "failed" in p:
            out.append(f"\nNot measured: {p['instances']} x {p['jobs']}: {p['failed']}.")
    if scale.get("variants"):
        out.append("\n" + variants_table(scale["variants"]))
    return "\n".join(out)


def scale_pictures(png_dir: Path) -> list[Path]:
    """One PNG a sweep (six panels); [] without matplotlib or results."""
    scale = read_result("scale")
    if not scale:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for kind, key, xlabel, png in SWEEPS:
        pts = sweep(scale, kind)
        if len(pts) < 2:
            continue
        x = [p[key] for p in pts]
        fig, axes = plt.subplots(2, 3, figsize=(13, 7))
        panels = [
            (
                "JetStream requests per slot",
                [("measured", [p["js_requests_per_slot"] for p in pts])]
                + ([("N + 1", [n + 1 for n in x])] if kind == "fleet" else []),
            ),
            (
                "nats-server per slot: CPU ms, messages / 100",
                [
                    ("CPU ms", [p["server_cpu_ms_per_slot"] for p in pts]),
                    (
                        "messages / 100",
                        [
                            (p["server_msgs_per_slot"] - p["js_requests_per_slot"]) / 100
                            for p in pts
                        ],
                    ),
                ],
            ),
            (
                "each sidecar's CPU ms per slot",
                [
                    ("all", [p["cpu_ms_per_slot_mean"] for p in pts]),
                    ("marginal (idle taken off)", [p["cpu_ms_per_slot_marginal"] for p in pts]),
                ],
            ),
            (
                "each sidecar idle: % of a core, wake-ups/s / 10",
                [
                    ("% of a core", [p["idle_cpu_percent_mean"] for p in pts]),
                    ("wake-ups/s / 10", [p["idle_wakeups_per_second"] / 10 for p in pts]),
                ],
            ),
            (
                "start delay ms (jitter 0)",
                [
                    ("p50", [p["start_delay"].get("p50_ms", 0) for p in pts]),
                    ("p99", [p["start_delay"].get("p99_ms", 0) for p in pts]),
                ],
            ),
            (
                "RSS MiB; time to ready s x 10",
                [
                    ("RSS MiB", [p["rss_mib_mean"] for p in pts]),
                    ("ready, joining, s x 10", [10 * p["ready_alone_s"] for p in pts]),
                ],
            ),
        ]
        for ax, (title, series) in zip(axes.flat, panels, strict=True):
            for label, ys in series:
                ax.plot(x, ys, marker="o", label=label)
            ax.set_xscale("log")
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.set_xticks(x)
            ax.set_xticklabels([str(v) for v in x])
            ax.set_title(title, fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"Scale: {xlabel} (bench.scale)", fontsize=10)
        fig.tight_layout()
        path = png_dir / png
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _replace(text: str, begin: str, end: str, block: str) -> str:
    head, found, rest = text.partition(begin)
    if not found:
        return text
    _, _, tail = rest.partition(end)
    return head + f"{begin}\n{block}\n{end}" + tail


def write_doc() -> None:
    text = DOC.read_text()
    if rows():  # the table of make bench, when its results are there
        capacity = capacity_table()
        block = f"Machine: {machine_line()}.\n\n{table()}"
        block += f"\n\n{capacity}" if capacity else ""
        text = _replace(text, BEGIN, END, block)
    scale = scale_block(DOC.parent)
    if scale:
        text = _replace(text, SCALE_BEGIN, SCALE_END, scale)
    DOC.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--write", action="store_true", help="update docs/PERFORMANCE.md")
    args = parser.parse_args()
    print(f"Machine: {machine_line()}\n")
    print(table())
    if capacity_table():
        print()
        print(capacity_table())
    png = DOC_PNG if args.write else RESULTS / "start-delay.png"
    if picture(png):
        print(f"\nstart-delay picture: {png.relative_to(ROOT)}")
    block = scale_block(DOC.parent)
    if block:
        print(f"\n{block}")
    for path in scale_pictures(DOC.parent if args.write else RESULTS):
        print(f"scale picture: {path.relative_to(ROOT)}")
    if args.write:
        write_doc()
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
