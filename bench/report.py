"""Plots and Markdown tables from the JSON results of bench/latency.py and bench/resources.py.

    .venv/bin/python bench/report.py [--latency /tmp/lapidus-latency.json]
                                     [--resources /tmp/lapidus-resources.json]
                                     [--drain /tmp/lapidus-jetstream-drain.json] [--docs docs]

Writes (matplotlib, Agg backend; ``pip install -e '.[bench]'``):

* ``docs/bench-latency-ccdf.png``: per backend, the fraction of rows slower than x (log-log),
  per rate and mode, with the bare-stream floor, from the run whose p99 is the median;
* ``docs/bench-latency-throughput.png``: rows committed and events received per second over the
  run, per backend and rate (same runs);
* ``docs/bench-resources-rss.png``: RSS of each process against events delivered in the long run;

and prints the Markdown tables of docs/dev/benchmarks.md (medians over the runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

MIB = 2 ** 20
NAMES = {"pg": "PostgreSQL", "mysql": "MariaDB"}


def median_run(entries, part="lapidus"):
    ranked = sorted(entries, key=lambda e: e[part]["from_commit"].get("p99", 0))
    return ranked[len(ranked) // 2]


def groups_of(lat):
    groups = {}
    for e in lat["runs"]:
        if "lapidus" in e:
            groups.setdefault((e["backend"], e["mode"], e["rate"]), []).append(e)
    return groups


def med(entries, part, key, stat):
    vals = [e[part][key][stat] for e in entries if part in e and e[part].get(key)]
    return statistics.median(vals) if vals else float("nan")


def rng(entries, part, key, stat):
    vals = [e[part][key][stat] for e in entries if part in e and e[part].get(key)]
    return (min(vals), max(vals)) if vals else (float("nan"), float("nan"))


def latency_tables(lat) -> str:
    groups = groups_of(lat)
    out = ["| backend | NATS mode | rows/s (achieved) | p50 | p99 | p99.9 | max | "
           "floor p50 / p99 | from `ts` column p50 / p99 | core subscriber p50 / p99 | "
           "schedule lag p99 | missing | runs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (backend, mode, rate), entries in sorted(groups.items(),
                                                 key=lambda kv: (kv[0][0], kv[0][1] != "jetstream",
                                                                 kv[0][2])):
        achieved = statistics.median(e["lapidus"]["achieved_rate"] for e in entries)
        p99lo, p99hi = rng(entries, "lapidus", "from_commit", "p99")
        core = (f"{med(entries, 'lapidus_core', 'from_commit', 'p50'):.2f} / "
                f"{med(entries, 'lapidus_core', 'from_commit', 'p99'):.2f}"
                if any("core_view" in e["lapidus"] for e in entries) else "")
        floor = (f"{med(entries, 'floor', 'from_commit', 'p50'):.2f} / "
                 f"{med(entries, 'floor', 'from_commit', 'p99'):.2f}"
                 if any("floor" in e for e in entries) else "")
        out.append(
            f"| {NAMES[backend]} | {mode} | {rate:,.0f} ({achieved:,.0f}) | "
            f"{med(entries, 'lapidus', 'from_commit', 'p50'):.2f} | "
            f"{med(entries, 'lapidus', 'from_commit', 'p99'):.2f} ({p99lo:.2f}-{p99hi:.2f}) | "
            f"{med(entries, 'lapidus', 'from_commit', 'p99.9'):.2f} | "
            f"{med(entries, 'lapidus', 'from_commit', 'max'):.2f} | {floor} | "
            f"{med(entries, 'lapidus', 'from_column', 'p50'):.2f} / "
            f"{med(entries, 'lapidus', 'from_column', 'p99'):.2f} | {core} | "
            f"{med(entries, 'lapidus', 'schedule_lag', 'p99'):.2f} | "
            f"{sum(e['lapidus']['missing'] for e in entries)} | {len(entries)} |")
    return "\n".join(out)


def flatten_core_views(lat) -> None:
    for e in lat["runs"]:
        if "lapidus" in e and "core_view" in e["lapidus"]:
            e["lapidus_core"] = e["lapidus"]["core_view"]


def plot_latency(lat, docs: Path) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = groups_of(lat)
    backends = [b for b in ("pg", "mysql") if any(k[0] == b for k in groups)]
    colors = {100.0: "tab:blue", 1000.0: "tab:orange", 5000.0: "tab:red"}
    fig, axes = plt.subplots(1, len(backends), figsize=(6.5 * len(backends), 4.6), squeeze=False)
    for ax, backend in zip(axes[0], backends):
        for (b, mode, rate), entries in sorted(groups.items()):
            if b != backend:
                continue
            e = median_run(entries)
            curve = e["lapidus"]["curve"]
            xs = [v for q, v in curve if q < 1]
            ys = [1 - q for q, v in curve if q < 1]
            style = "-" if mode == "jetstream" else "--"
            ax.plot([max(x, 0.01) for x in xs], ys, style, color=colors.get(rate, "k"),
                    label=f"{rate:,.0f}/s {mode}")
            if "floor" in e and mode == "jetstream":
                curve = e["floor"]["curve"]
                ax.plot([max(v, 0.01) for q, v in curve if q < 1],
                        [1 - q for q, v in curve if q < 1], ":", color=colors.get(rate, "k"),
                        alpha=0.7, label=f"{rate:,.0f}/s bare stream")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 1.05)
        ax.axvline(10, color="grey", lw=0.8)
        ax.set_xlabel("latency, ms (COMMIT returned -> event at the subscriber)")
        ax.set_ylabel("fraction of rows slower")
        ax.set_title(f"{NAMES[backend]} -> Lapidus -> NATS")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    ccdf = docs / "bench-latency-ccdf.png"
    fig.savefig(ccdf, dpi=110)
    plt.close(fig)

    rates = sorted({k[2] for k in groups})
    fig, axes = plt.subplots(len(backends), len(rates),
                             figsize=(4.2 * len(rates), 3.0 * len(backends)), squeeze=False)
    for i, backend in enumerate(backends):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            entries = groups.get((backend, "jetstream", rate))
            if not entries:
                ax.set_visible(False)
                continue
            e = median_run(entries)
            tp = e["lapidus"]["throughput"]
            ax.plot(range(len(tp["commits"])), tp["commits"], color="grey", label="committed")
            ax.plot(range(len(tp["received"])), tp["received"], color=colors.get(rate, "k"),
                    label="received (JetStream consumer)")
            ax.set_title(f"{NAMES[backend]}, {rate:,.0f} rows/s", fontsize=9)
            ax.set_xlabel("second of the run", fontsize=8)
            ax.set_ylabel("rows per second", fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    tput = docs / "bench-latency-throughput.png"
    fig.savefig(tput, dpi=110)
    plt.close(fig)
    return [ccdf, tput]


def resource_tables(res) -> str:
    phases = [p for p in res["phases"] if p["phase"] != "long"]
    names = sorted({n for p in phases for n in p["rss"]},
                   key=lambda n: (n == "nats-server", n != "supervisor", n != "dispatcher", n))
    out = ["RSS, MiB (median of samples every 0.5 s; max in parentheses):", "",
           "| phase | events/s | " + " | ".join(names) + " |",
           "|---|---|" + "---|" * len(names)]
    for p in phases:
        cells = []
        for n in names:
            r = p["rss"].get(n)
            cells.append(f"{r['median'] / MIB:.1f} ({r['max'] / MIB:.1f})" if r else "")
        flag = " (restarted: " + ", ".join(p["restarted"]) + ")" if p.get("restarted") else ""
        out.append(f"| {p['phase']}{flag} | {p['events_per_s']:,.0f} | " + " | ".join(cells)
                   + " |")
    out += ["", "CPU seconds per 1,000 events (cores busy in parentheses):", "",
            "| phase | events | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names)]
    for p in res["phases"]:
        if not p["events"]:
            continue
        cells = []
        for n in names:
            c = p["cpu"].get(n)
            cells.append(f"{c['per_1000_events']:.3f} ({c['cores']:.2f})"
                         if c and c.get("per_1000_events") is not None else "")
        out.append(f"| {p['phase']} | {p['events']:,} | " + " | ".join(cells) + " |")
    for p in res["phases"]:
        if p["phase"] == "long":
            out += ["", f"Long run: {p['events']:,} events in {p['seconds']:.0f} s "
                        f"({p['events_per_s']:,.0f}/s), both backends at once.", "",
                    "| process | RSS at the start | RSS half-way | RSS at the end | max | "
                    "slope over the second half, KiB per million events | growth extrapolated "
                    "to 5M events |",
                    "|---|---|---|---|---|---|---|"]
            for n, s in sorted(p["slopes"].items()):
                start = s.get("rss_start")
                out.append(f"| {n} | {start / MIB if start else float('nan'):.1f} MiB "
                           f"| {s['rss_first'] / MIB:.1f} MiB | {s['rss_last'] / MIB:.1f} MiB"
                           f" | {s['rss_max'] / MIB:.1f} MiB"
                           f" | {s['kib_per_million_events']:+.0f} | "
                           f"{s['extrapolated_5m_growth_mib']:+.1f} MiB |")
    for key, title in (("uss_idle", "USS idle"), ("uss_idle_after", "USS idle after the long run")):
        if key in res:
            out += ["", f"{title}: " + ", ".join(f"{n} {v / MIB:.1f} MiB"
                                                 for n, v in sorted(res[key].items()))]
    return "\n".join(out)


def plot_resources(res, docs: Path) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    long = next((p for p in res["phases"] if p["phase"] == "long"), None)
    if not long:
        return []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = sorted({k for s in long["samples"] for k in s if k not in ("t", "events")})
    for n in names:
        pts = [(s["events"] / 1e6, s[n] / MIB) for s in long["samples"] if n in s]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=n)
    ax.set_xlabel("events delivered in the long run (millions)")
    ax.set_ylabel("RSS, MiB")
    ax.set_yscale("log")
    ax.set_title("RSS per process over the long run (PostgreSQL + MariaDB -> JetStream)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = docs / "bench-resources-rss.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def profile_tables(res) -> str:
    out = []
    for key, prof in res.get("profile", {}).items():
        label, backend = key.split(":")
        out.append(f"\nProfile at {label}, {NAMES[backend]} ({prof['rows']:,} rows written):")
        for pname, s in prof["stacks"].items():
            waiting = s['idle_like'] / max(1, s['samples'])
            out.append(f"  {pname}: {s['samples']} samples, {waiting:.0%} waiting")
            for f, share in s["self"][:10]:
                out.append(f"      self {share:6.1%}  {f}")
    return "\n".join(out)


def drain_table(drain) -> str:
    out = ["| source | baseline | baseline rows/s | Lapidus -> JetStream rows/s "
           "(first to last message) | ratio (per run) | target |", "|---|---|---|---|---|---|"]
    info = {"pg": ("PostgreSQL", "pg_recvlogical pgoutput -> file", "0.8"),
            "mysql": ("MariaDB", "bare BinLogStreamReader loop", "0.9")}
    for backend, runs in drain["runs"].items():
        if not runs:
            continue
        name, base, target = info[backend]
        ratios = [r["lapidus"] / r["baseline"] for r in runs]
        out.append(f"| {name} | {base} | {statistics.median(r['baseline'] for r in runs):,.0f} | "
                   f"{statistics.median(r['lapidus'] for r in runs):,.0f} "
                   f"({statistics.median(r['lapidus_first_to_last'] for r in runs):,.0f}) | "
                   f"{statistics.median(ratios):.2f} ({' '.join(f'{x:.2f}' for x in ratios)}) | "
                   f"{target} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", default="/tmp/lapidus-latency.json")
    parser.add_argument("--resources", default="/tmp/lapidus-resources.json")
    parser.add_argument("--drain", default="/tmp/lapidus-jetstream-drain.json")
    parser.add_argument("--docs", default=str(Path(__file__).resolve().parent.parent / "docs"))
    args = parser.parse_args()
    docs = Path(args.docs)
    if Path(args.latency).exists():
        lat = json.loads(Path(args.latency).read_text())
        flatten_core_views(lat)
        print("## latency\n")
        print(latency_tables(lat))
        print("\nplots: " + ", ".join(str(p) for p in plot_latency(lat, docs)))
    if Path(args.resources).exists():
        res = json.loads(Path(args.resources).read_text())
        print("\n## resources\n")
        print(resource_tables(res))
        print(profile_tables(res))
        print("\nplots: " + ", ".join(str(p) for p in plot_resources(res, docs)))
    if Path(args.drain).exists():
        print("\n## drains into JetStream\n")
        print(drain_table(json.loads(Path(args.drain).read_text())))


if __name__ == "__main__":
    main()
