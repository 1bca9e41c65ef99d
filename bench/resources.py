"""Memory and CPU of each Lapidus process: idle, at 1,000 rows/s, at the ceiling, over a long run.

    .venv/bin/python bench/resources.py [--phase-seconds 20] [--long-events 5000000]
                                        [--long-seconds 600] [--profile] [--out FILE]

One ``lapidus`` with two backends (PostgreSQL ``pg`` and MariaDB ``maria``, the tables of
bench/latency.py) and the nats plugin in JetStream mode, publishing into a stream this script
creates (file storage, 512 MiB, oldest messages discarded so the disk does not fill).
Phases, one after the other, each backend on its own (the other idle) except the long run:

* ``idle``: both workers streaming, nothing written, for ``--phase-seconds``;
* ``rate1000``: the open-loop generator of bench/latency.py at 1,000 single-row commits/s;
* ``ceiling``: the generator closed loop, as fast as its 8 connections go, single-row commits
  (``ceiling1``) and 100-row commits (``ceiling100``);
* ``long``: both backends at once, each at ``--long-rate`` rows/s (10,000; 100-row commits,
  open loop), until ``--long-events`` rows were written or ``--long-seconds`` passed, and until
  the stream holds them all; then ``idle-after``.

Every phase ends when the stream holds every row written (so the work is all counted), and
reports per process (supervisor, dispatcher, each worker, pg_recvlogical; nats-server beside
them for context): RSS (median and max of samples every 0.5 s), CPU seconds (psutil
``cpu_times`` user+system) and CPU seconds per 1,000 events, events/s. The long run samples RSS
every 2 s against the stream's event count and reports the slope of a least-squares line
through the samples of the second half of the events, in KiB per million events (growth
extrapolated to 5M events when fewer were reached). ``--profile`` adds, after the measured
phases, a run per backend at each ceiling with ``py-spy record`` (200 Hz, non-blocking) on
the worker, dispatcher and supervisor (raw collapsed stacks, summarized to the top self and
inclusive functions).

Results go to ``--out`` (JSON) for ``bench/report.py``. Waits for a quiet machine first.
Creates and drops the databases ``lapidus_bench_latency``, the slot and the stream it made.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psutil  # noqa: E402

import latency as L  # noqa: E402

MIB = 2 ** 20
#: the long run's RSS slope is fitted over the samples after this share of the events: the
#: first million or two events grow the heaps to their working size (batches of 1,000 events,
#: up to 8 in flight), which is not growth that continues
FIT_FROM = 0.5
PY_SPY = str(Path(sys.executable).parent / "py-spy")


def nats_server() -> psutil.Process | None:
    """The nats-server listening on NATS's port (tests may run others beside it)."""
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == L.NATS[1] and conn.pid:
            return psutil.Process(conn.pid)
    return None


class Sampler:
    """Samples RSS of the processes every ``interval`` s in a thread, with the stream count."""

    def __init__(self, processes: Dict[str, psutil.Process], stream: str, interval: float,
                 with_events: bool = False):
        self.processes = processes
        self.stream = stream
        self.interval = interval
        self.with_events = with_events
        self.samples: List[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = {"t": time.time()}
            for name, p in self.processes.items():
                try:
                    sample[name] = p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            if self.with_events:
                try:
                    sample["events"] = L.stream_last_seq(self.stream)
                except Exception:
                    pass
            self.samples.append(sample)
            self._stop.wait(self.interval)

    def stop(self) -> List[dict]:
        self._stop.set()
        self._thread.join(10)
        return self.samples


def cpu_of(processes: Dict[str, psutil.Process]) -> Dict[str, float]:
    out = {}
    for name, p in processes.items():
        try:
            t = p.cpu_times()
            out[name] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for_events(stream: str, target: int, timeout: float = 600) -> float:
    """Time at which the stream's last sequence reached ``target``."""
    give_up = time.monotonic() + timeout
    while True:
        seq = L.stream_last_seq(stream)
        if seq >= target:
            return time.time()
        if time.monotonic() > give_up:
            raise RuntimeError(f"stream stuck at {seq}, expected {target}")
        time.sleep(0.05)


def phase(name: str, get_processes, stream: str, action) -> dict:
    """Run ``action()`` (returns rows written) while sampling; wait for the stream to hold them.

    A process that was replaced during the phase (a worker restarted by the supervisor) is
    reported under ``restarted`` and its CPU figure left out."""
    processes = get_processes()
    before_seq = L.stream_last_seq(stream)
    cpu0 = cpu_of(processes)
    sampler = Sampler(processes, stream, 0.5)
    started = time.time()
    rows = action()
    caught_up = wait_for_events(stream, before_seq + rows) if rows else time.time()
    samples = sampler.stop()
    cpu1 = cpu_of(processes)
    events = L.stream_last_seq(stream) - before_seq
    elapsed = caught_up - started
    after = get_processes()
    restarted = sorted(n for n, p in processes.items()
                       if n not in after or after[n].pid != p.pid)
    result = {"phase": name, "seconds": elapsed, "events": events,
              "events_per_s": events / elapsed if elapsed > 0 else 0.0, "rss": {}, "cpu": {},
              "restarted": restarted, "pids": {n: p.pid for n, p in processes.items()}}
    for n in restarted:
        cpu1.pop(n, None)
    for pname in processes:
        values = [s[pname] for s in samples if pname in s]
        if values:
            result["rss"][pname] = {"median": statistics.median(values), "max": max(values),
                                    "last": values[-1]}
        if pname in cpu0 and pname in cpu1:
            spent = cpu1[pname] - cpu0[pname]
            result["cpu"][pname] = {"seconds": spent,
                                    "per_1000_events": spent / events * 1000 if events else None,
                                    "cores": spent / elapsed if elapsed > 0 else None}
    return result


def uss_of(processes) -> Dict[str, int]:
    out = {}
    for name, p in processes.items():
        try:
            out[name] = p.memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def fit_slope(xs: List[float], ys: List[float]) -> float:
    n = len(xs)
    if n < 3:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else float("nan")


def py_spy(processes: Dict[str, psutil.Process], seconds: int, tmp: Path) -> dict:
    """py-spy record on the Python processes at once; top self and inclusive functions."""
    procs = {}
    for name, p in processes.items():
        if name in ("pg_recvlogical", "nats-server"):
            continue
        out = tmp / f"{name.replace(' ', '_')}.raw"
        procs[name] = (out, subprocess.Popen(
            [PY_SPY, "record", "-p", str(p.pid), "-d", str(seconds), "-f", "raw", "-o", str(out),
             "--nonblocking", "-r", "200"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    summary = {}
    for name, (out, proc) in procs.items():
        proc.wait(seconds + 60)
        if not out.exists():
            continue
        summary[name] = summarize_raw(out.read_text())
    return summary


def summarize_raw(text: str, top: int = 15) -> dict:
    own, inclusive = collections.Counter(), collections.Counter()
    total = idle = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        leaf = frames[-1]
        total += n
        # the event loop or a blocking read waiting for work: not CPU
        if any(w in leaf for w in ("select (selectors.py", "poll (selectors.py", "_recv_into",
                                   "wait (threading.py", "select (select", "recv (",
                                   "read (socket.py", "epoll", "sleep")):
            idle += n
        own[leaf] += n
        for f in set(frames):
            inclusive[f] += n
    return {"samples": total, "idle_like": idle,
            "self": [(f, n / total) for f, n in own.most_common(top)] if total else [],
            "inclusive": [(f, n / total) for f, n in inclusive.most_common(top + 10)]
            if total else []}


def report_phase(r: dict) -> None:
    print(f"  {r['phase']:12} {r['events']:>9,} events in {r['seconds']:6.1f} s "
          f"({r['events_per_s']:>8,.0f}/s)"
          + (f"  RESTARTED during the phase: {', '.join(r['restarted'])}"
             if r.get("restarted") else ""))
    for pname in sorted(r["rss"]):
        cpu = r["cpu"].get(pname, {})
        per = cpu.get("per_1000_events")
        print(f"      {pname:20} RSS median {r['rss'][pname]['median'] / MIB:7.1f} MiB "
              f"max {r['rss'][pname]['max'] / MIB:7.1f}  CPU {cpu.get('seconds', 0):7.2f} s"
              + (f" = {per:.3f} s per 1,000 events" if per is not None else "")
              + (f", {cpu['cores']:.2f} cores" if cpu.get('cores') is not None else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-seconds", type=float, default=20.0)
    parser.add_argument("--long-events", type=int, default=5_000_000)
    parser.add_argument("--long-seconds", type=float, default=600.0)
    parser.add_argument("--long-rate", type=float, default=10000.0,
                        help="rows/s per backend in the long run")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-seconds", type=int, default=8)
    parser.add_argument("--skip", default="", help="comma list of phases to skip")
    parser.add_argument("--no-wait", action="store_true")
    parser.add_argument("--out", default="/tmp/lapidus-resources.json")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    backends = ["pg", "mysql"]
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "argv": sys.argv[1:], "phases": []}
    L.delete_bench_streams()
    L.setup_databases(backends)
    if not args.no_wait:
        results["quiet_at_start"] = L.wait_quiet(30.0, max_load=1.0)
    stream = f"LATBENCH_RES_{uuid.uuid4().hex[:6].upper()}"
    L.create_stream(stream, max_bytes=512 * MIB)
    next_id = [1]

    def ids(count: int) -> int:
        first = next_id[0]
        next_id[0] += count + 1000
        return first

    def save():
        Path(args.out).write_text(json.dumps(results, indent=1))

    with tempfile.TemporaryDirectory(prefix="lapidus-resources-") as tmpdir:
        tmp = Path(tmpdir)
        proc = L.start_lapidus(tmp, L.lapidus_config(tmp, backends, "jetstream", stream))
        try:
            L.warm_up("pg", L.nats_seen(f"{L.PREFIX}.public.>"))
            L.warm_up("mysql", L.nats_seen(f"{L.PREFIX}.{L.DB}.>"))
            time.sleep(1.0)

            def get_processes():
                found = L.lapidus_processes(proc)
                ns = nats_server()
                if ns:
                    found["nats-server"] = ns
                return found
            processes = get_processes()
            print("processes: " + ", ".join(f"{n} ({p.pid})" for n, p in processes.items()))

            def gen(backend, rate, seconds, rows_per_tx=1, threads=8):
                def action():
                    expected = int(rate * seconds) if rate else 10 ** 9
                    g = L.Generator(backend, rate, seconds, ids(min(expected, 10 ** 8)),
                                    tmp / "gen.pkl", threads=threads, rows_per_tx=rows_per_tx,
                                    record=False)
                    return g.result()["rows"]
                return action

            def run(name, action):
                if name.split(":")[0] in skip:
                    return None
                if not args.no_wait:
                    L.wait_quiet(30.0 + (0 if "idle" in name else 0))
                try:
                    r = phase(name, get_processes, stream, action)
                except Exception as exc:     # a server restarted under us, say
                    print(f"  phase {name} failed: {type(exc).__name__}: {exc}", flush=True)
                    results.setdefault("failures", []).append(f"{name}: {exc}")
                    return None
                r["others_after"] = L.competitors()
                results["phases"].append(r)
                report_phase(r)
                save()
                return r

            time.sleep(args.phase_seconds / 2)
            run("idle", lambda: (time.sleep(args.phase_seconds), 0)[1])
            results["uss_idle"] = uss_of(get_processes())
            for backend in backends:
                run(f"rate1000:{backend}", gen(backend, 1000, args.phase_seconds))
            for backend in backends:
                run(f"ceiling1:{backend}", gen(backend, 0, args.phase_seconds))
            for backend in backends:
                run(f"ceiling100:{backend}", gen(backend, 0, args.phase_seconds,
                                                 rows_per_tx=100))
            if args.profile:
                for label, per_tx in (("ceiling1", 1), ("ceiling100", 100)):
                    for backend in backends:
                        if not args.no_wait:
                            L.wait_quiet(30.0)
                        g = L.Generator(backend, 0, args.profile_seconds + 6, ids(10 ** 8),
                                        tmp / "gen.pkl", threads=8, rows_per_tx=per_tx,
                                        record=False)
                        time.sleep(3)
                        prof = py_spy(get_processes(), args.profile_seconds, tmp)
                        rows = g.result()["rows"]
                        results.setdefault("profile", {})[f"{label}:{backend}"] = {
                            "rows": rows, "stacks": prof}
                        print(f"  profile at {label}, {backend}:")
                        for pname, s in prof.items():
                            print(f"    {pname}: {s['samples']} samples, "
                                  f"{s['idle_like'] / max(1, s['samples']):.0%} waiting")
                            for f, share in s["self"][:8]:
                                print(f"        self {share:6.1%}  {f}")
                        save()
                        time.sleep(5)
            if "long" not in skip:
                try:
                    long_run(args, get_processes(), stream, tmp, ids, results)
                except Exception as exc:
                    print(f"  long run failed: {type(exc).__name__}: {exc}", flush=True)
                    results.setdefault("failures", []).append(f"long: {exc}")
                save()
                time.sleep(5)
                run("idle-after", lambda: (time.sleep(args.phase_seconds), 0)[1])
                results["uss_idle_after"] = uss_of(get_processes())
            save()
        finally:
            L.stop_lapidus(proc)
            L.keep_log(tmp, "resources")
            L.delete_stream(stream)
            L.drop_databases(backends)
    print_uss(results)


def long_run(args, processes, stream, tmp, ids, results) -> None:
    """Both backends at --long-rate rows/s each (100-row commits, open loop: below the ceiling,
    so the run measures a steady state, not a growing backlog), until long_events rows were
    written or long_seconds passed; then until the stream holds them all."""
    if not args.no_wait:
        L.wait_quiet(30.0)
    start_seq = L.stream_last_seq(stream)
    cpu0 = cpu_of(processes)
    sampler = Sampler(processes, stream, 2.0, with_events=True)
    started = time.time()
    stop_at = started + args.long_seconds
    written = 0
    # generators in chunks of 60 s so the run stops close to the target
    while time.time() < stop_at and written < args.long_events:
        chunk = min(60.0, stop_at - time.time(),
                    (args.long_events - written) / (2 * args.long_rate))
        if chunk < 1:
            break
        gens = [L.Generator(b, args.long_rate, chunk, ids(10 ** 8), tmp / f"gen-{b}.pkl",
                            threads=4, rows_per_tx=100, record=False) for b in ("pg", "mysql")]
        written += sum(g.result()["rows"] for g in gens)
        print(f"    long run: {written:,} rows written, "
              f"{L.stream_last_seq(stream) - start_seq:,} events in the stream after "
              f"{time.time() - started:.0f} s", flush=True)
    caught_up = wait_for_events(stream, start_seq + written, timeout=900)
    samples = sampler.stop()
    cpu1 = cpu_of(processes)
    events = L.stream_last_seq(stream) - start_seq
    elapsed = caught_up - started
    out = {"phase": "long", "events": events, "seconds": elapsed,
           "events_per_s": events / elapsed, "cpu": {}, "slopes": {}, "samples": []}
    for s in samples:
        if "events" in s:
            out["samples"].append({k: (v - start_seq if k == "events" else v)
                                   for k, v in s.items()})
    for pname in processes:
        spent = cpu1.get(pname, 0) - cpu0.get(pname, 0)
        out["cpu"][pname] = {"seconds": spent, "per_1000_events": spent / events * 1000,
                             "cores": spent / elapsed}
        pts = [(s["events"], s[pname]) for s in out["samples"] if pname in s]
        pts = [p for p in pts if p[0] >= FIT_FROM * events]
        if len(pts) >= 3:
            slope = fit_slope([p[0] / 1e6 for p in pts], [p[1] / 1024 for p in pts])
            first, last = pts[0][1], pts[-1][1]
            out["slopes"][pname] = {
                "kib_per_million_events": slope, "rss_first": first, "rss_last": last,
                "rss_max": max(p[1] for p in pts),
                "extrapolated_5m_growth_mib": slope * 5 / 1024,
                "fit_from_events": pts[0][0], "rss_start": samples[0].get(pname)}
    results["phases"].append(out)
    print(f"  long run: {events:,} events in {elapsed:.0f} s ({events / elapsed:,.0f}/s)")
    for pname, s in out["slopes"].items():
        print(f"      {pname:20} RSS {s['rss_first'] / MIB:7.1f} -> {s['rss_last'] / MIB:7.1f} MiB "
              f"(max {s['rss_max'] / MIB:.1f}); slope {s['kib_per_million_events']:+8.1f} KiB "
              f"per million events; CPU {out['cpu'][pname]['per_1000_events']:.3f} s per 1,000")


def print_uss(results) -> None:
    for key in ("uss_idle", "uss_idle_after"):
        if key in results:
            print(f"  {key}: " + ", ".join(f"{n} {v / MIB:.1f} MiB"
                                           for n, v in sorted(results[key].items())))


if __name__ == "__main__":
    main()
