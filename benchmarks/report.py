"""Render a results JSON into BENCHMARKS.md (between its results markers) and a PNG plot.

A full run replaces the part of BENCHMARKS.md between ``<!-- results:begin -->`` and
``<!-- results:end -->`` (the prose around it is kept) and writes
``benchmarks/latency_throughput.png``; a ``--quick`` run writes
``benchmarks/results/BENCHMARKS-quick.md`` and ``benchmarks/results/latency_throughput-quick.png``
instead, so a smoke run never overwrites the published numbers.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
ORDER = ("mservd", "torchserve", "naive-flask")


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}f}"
    return str(v)


def _ratio(a: Any, b: Any) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
        return "–"
    return f"{a / b:.2f}x"


def _round_ratios(results: dict[str, Any], path: tuple[str, ...], other: str) -> str | None:
    """mservd's figure over ``other``'s in each valid round: the median and range."""
    ratios = []
    for r in results.get("rounds") or []:
        a, b = r.get("mservd"), r.get(other)
        if not a or not b or not valid(a) or not valid(b):
            continue
        x, y = _get(a, *path), _get(b, *path)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
            ratios.append(x / y)
    if len(ratios) < 2:
        return None
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f})"


def _errors(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "–"
    errs = entry.get("errors") or {}
    parts = [f"{k}: {v}" for k, v in sorted(errs.items())]
    if entry.get("backlog"):
        parts.append(f"client backlog: {entry['backlog']}")
    return ", ".join(parts) or "0"


def _median_tree(items: list[Any]) -> Any:
    """The median of each number in a list of like-shaped result trees. A count of errors of a
    kind that a round did not have is 0 in that round, not left out of the median."""
    numbers = [i for i in items if isinstance(i, (int, float)) and not isinstance(i, bool)]
    if numbers and len(numbers) == len(items):
        return statistics.median(numbers)
    if items and all(isinstance(i, dict) for i in items):
        keys = {k for i in items for k in i}
        return {k: _median_counts([i.get(k) or {} for i in items]) if k == "errors"
                else _median_tree([i[k] for i in items if k in i]) for k in keys}
    return items[0] if items else None


def _median_counts(rounds: list[dict[str, int]]) -> dict[str, float]:
    """Per kind, the median count over the rounds (0 where a round had none); kinds with a
    median of 0 are left out, as a round without errors has none."""
    kinds = {k for r in rounds for k in r}
    counts = {k: statistics.median(r.get(k, 0) for r in rounds) for k in kinds}
    return {k: v for k, v in counts.items() if v}


def valid(entry: dict[str, Any]) -> bool:
    return "error" not in entry and (entry.get("machine") or {}).get("valid", True)


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system, the median of every figure over its valid rounds (all of them if none is
    valid, marked so), with how many rounds counted."""
    out = {}
    for name in {n for r in rounds for n in r}:
        entries = [r[name] for r in rounds if name in r]
        good = [e for e in entries if valid(e)]
        merged = _median_tree(good or entries)
        merged["rounds_valid"] = len(good)
        merged["rounds_run"] = len(entries)
        for e in entries:  # memory_workers runs in the first round only
            if "memory_workers" in e:
                merged["memory_workers"] = e["memory_workers"]
        out[name] = merged
    return out


def rows(results: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(label, {system: value}, kind, path) where kind says how to show it."""
    systems = results["systems"]
    out: list[tuple[str, dict[str, Any], str]] = []

    def add(label: str, kind: str, *path: str) -> None:
        out.append((label, {s: _get(systems.get(s), *path) for s in ORDER}, kind, path))

    for model in ("tiny", "resnet18"):
        closed = _get(systems.get("mservd"), model, "closed") or {}
        conc = sorted({int(c) for s in ORDER for c in (_get(systems.get(s), model, "closed") or {})}
                      or {int(c) for c in closed})
        for c in conc:
            add(f"{model} c={c}: throughput (req/s)", "num", model, "closed", str(c), "throughput")
            add(f"{model} c={c}: p50 (ms)", "num", model, "closed", str(c), "p50_ms")
            add(f"{model} c={c}: p99 (ms)", "num", model, "closed", str(c), "p99_ms")
            add(f"{model} c={c}: errors", "err", model, "closed", str(c))
        factors = sorted({f for s in ORDER for f in (_get(systems.get(s), model, "open") or {})},
                         key=float)
        for f in factors:
            add(f"{model} open {f}x own max: offered (req/s)", "num", model, "open", f, "rate")
            add(f"{model} open {f}x: answered right (req/s)", "num", model, "open", f,
                "throughput")
            add(f"{model} open {f}x: accepted p50 (ms)", "num", model, "open", f, "p50_ms")
            add(f"{model} open {f}x: accepted p99 (ms)", "num", model, "open", f, "p99_ms")
            add(f"{model} open {f}x: refusals p99 (ms)", "num", model, "open", f,
                "error_p99_ms")
            add(f"{model} open {f}x: errors", "err", model, "open", f)
    add("ready: command to both models loaded (s)", "num", "ready_seconds")
    add("then first right answer of each model (s)", "num", "first_answers_seconds")
    add("memory idle: RSS (MiB)", "num", "memory_idle", "rss_mib")
    add("memory idle: PSS (MiB)", "num", "memory_idle", "pss_mib")
    add("memory under load (tiny c=64 peak): RSS (MiB)", "num", "tiny", "closed", "64",
        "memory_peak", "rss_mib")
    add("memory under load (tiny c=64 peak): PSS (MiB)", "num", "tiny", "closed", "64",
        "memory_peak", "pss_mib")
    for n in ("1", "4"):
        add(f"resnet18 alone, {n} worker(s): idle RSS (MiB)", "num", "memory_workers", n,
            "idle", "rss_mib")
        add(f"resnet18 alone, {n} worker(s): idle PSS (MiB)", "num", "memory_workers", n,
            "idle", "pss_mib")
        add(f"resnet18 alone, {n} worker(s): under load PSS (MiB)", "num", "memory_workers", n,
            "load", "pss_mib")
    return out


def table(results: dict[str, Any]) -> str:
    present = [s for s in ORDER if s in results["systems"]]
    head = ["figure", *present]
    if "mservd" in present:
        head += [f"mservd / {s}" for s in present if s != "mservd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, values, kind, path in rows(results):
        if all(values.get(s) is None for s in present):
            continue
        if kind == "err":
            cells = [_errors(values.get(s)) for s in present]
            ratios = ["" for s in present if s != "mservd"] if "mservd" in present else []
        else:
            cells = [_fmt(values.get(s)) for s in present]
            ratios = ([_round_ratios(results, path, s) or _ratio(values.get("mservd"),
                                                                 values.get(s))
                       for s in present if s != "mservd"] if "mservd" in present else [])
        lines.append("| " + " | ".join([label, *cells, *ratios]) + " |")
    return "\n".join(lines)


def cpu_table(results: dict[str, Any]) -> str:
    lines = []
    for s in ORDER:
        cpu = _get(results["systems"].get(s), "tiny", "closed", "64", "cpu")
        if not cpu:
            continue
        wall = cpu["wall_seconds"]
        parts = ", ".join(f"{role} {secs / wall:.2f}" for role, secs in
                          sorted(cpu["cpu_seconds"].items(), key=lambda kv: -kv[1]))
        lines.append(f"- **{s}** ({cpu['cores_busy']} cores busy in all): {parts}")
    return "\n".join(lines)


def _over(a: float, b: float) -> float:
    """a / b, where a system that answered nothing (b = 0) is beaten by anything."""
    return a / b if b else math.inf


def _judgements(sy: dict[str, Any], inproc: dict[str, Any]) -> list[tuple[str, bool, str, str]]:
    """Issue 18's targets judged on one set of figures, the medians or one round's:
    (target, met, its figures, the one figure that decides it)."""
    m, ts, nf = sy.get("mservd") or {}, sy.get("torchserve") or {}, sy.get("naive-flask") or {}
    out = []
    t64, ts64 = _get(m, "tiny", "closed", "64"), _get(ts, "tiny", "closed", "64")
    if t64 and ts64:
        ratio = _over(t64["throughput"], ts64["throughput"])
        out.append(("tiny c=64 ≥ 2x TorchServe throughput, lower p99",
                    ratio >= 2 and t64["p99_ms"] < ts64["p99_ms"],
                    (f"{t64['throughput']:.0f} vs {ts64['throughput']:.0f} req/s ({ratio:.2f}x); "
                     f"p99 {t64['p99_ms']:.1f} vs {ts64['p99_ms']:.1f} ms"), f"{ratio:.2f}x"))
    c1, nf1 = _get(m, "tiny", "closed", "1"), _get(nf, "tiny", "closed", "1")
    if c1 and nf1:
        out.append(("tiny c=1 p50 ≤ 1.2x the naive Flask route's",
                    c1["p50_ms"] <= 1.2 * nf1["p50_ms"],
                    f"{c1['p50_ms']:.2f} vs {nf1['p50_ms']:.2f} ms",
                    f"{_over(c1['p50_ms'], nf1['p50_ms']):.2f}x"))
    o9 = _get(m, "tiny", "open", "0.9")
    if o9:
        refused = (o9.get("errors") or {}).get("503", 0) / max(o9.get("sent") or 1, 1)
        out.append(("tiny open 0.9x own max: under 1 % refused", refused < 0.01,
                    f"{refused:.1%}", f"{refused:.1%}"))
    o = _get(m, "tiny", "open", "1.8")
    if o and t64:
        refusal_p99 = o.get("error_p99_ms") or 0
        share = _over(o["throughput"], t64["throughput"])
        out.append((("tiny open 1.8x, 100 ms target: accepted p99 < 100 ms, right answers ≥ 90 % "
                     "of c=64's, refusals p99 < 20 ms"),
                    (o["p99_ms"] or 1e9) < 100 and share >= 0.9 and refusal_p99 < 20,
                    (f"accepted p99 {_fmt(o['p99_ms'])} ms, {o['throughput']:.0f} vs "
                     f"{t64['throughput']:.0f} req/s, refusals p99 {_fmt(refusal_p99)} ms"),
                    f"{share:.0%} (p99 {_fmt(o['p99_ms'], 0)} ms)"))
    # the limit measured just before mservd's c=64 (its median over the rounds, for the
    # medians), else the one measured once at the start of the run
    lim = (_get(m, "resnet18", "inprocess_limit", "throughput")
           or _get(inproc, "resnet18", "throughput"))
    for c in ("1", "8", "64"):
        r, t, n = (_get(x, "resnet18", "closed", c) for x in (m, ts, nf))
        if r and (t or n):
            best = max(x["throughput"] for x in (t, n) if x)
            ok = r["throughput"] >= best
            detail = (f"{r['throughput']:.1f} vs TorchServe {_fmt(_get(t, 'throughput'))}, "
                      f"naive {_fmt(_get(n, 'throughput'))} req/s")
            figure = f"{_over(r['throughput'], best):.2f}x"
            if c == "64" and lim:
                ok = ok and r["throughput"] >= 0.95 * lim
                detail += f"; {r['throughput'] / lim:.0%} of the in-process limit {lim:.1f}"
                figure += f" ({r['throughput'] / lim:.0%} of the limit)"
            out.append((f"resnet18 c={c}: ≥ TorchServe's and the naive route's throughput"
                        + (", ≥ 95 % of the in-process limit" if c == "64" else ""), ok, detail,
                        figure))
    if m.get("ready_seconds") and ts.get("ready_seconds"):
        out.append(("ready time ≤ 1/3 of TorchServe's",
                    m["ready_seconds"] <= ts["ready_seconds"] / 3,
                    f"{m['ready_seconds']:.1f} vs {ts['ready_seconds']:.1f} s",
                    f"{_over(m['ready_seconds'], ts['ready_seconds']):.2f}x"))
    mp, tp = _get(m, "memory_idle", "pss_mib"), _get(ts, "memory_idle", "pss_mib")
    if mp and tp:
        out.append(("idle PSS ≤ 1/3 of TorchServe's", mp <= tp / 3, f"{mp:.0f} vs {tp:.0f} MiB",
                    f"{_over(mp, tp):.2f}x"))
    return out


def targets(results: dict[str, Any]) -> str:
    """Issue 18's targets, each judged on the medians over the valid rounds, and beside it in
    how many valid rounds it was met, with each round's deciding figure (against the better
    of the other systems, where it is a ratio): the issue counts a target met on the median
    with every round on its side or within the spread, which the reader judges from these."""
    inproc = results.get("inprocess", {})
    rounds = [_judgements({name: e for name, e in r.items() if valid(e)}, inproc)
              for r in results.get("rounds") or []]
    lines = []
    for target, ok, detail, _ in _judgements(results["systems"], inproc):
        judged = [(met, figure) for judgements in rounds
                  for name, met, _, figure in judgements if name == target]
        by_round = (f"{sum(met for met, _ in judged)} of {len(judged)}: "
                    + "; ".join(figure for _, figure in judged)) if judged else "–"
        lines.append(f"| {target} | {'met' if ok else '**not met**'} | {detail} | {by_round} |")
    if not lines:
        return ""
    return ("| target | result | medians | rounds meeting it: each round's figure |\n"
            "|---|---|---|---|\n" + "\n".join(lines))


def _limits_beside(results: dict[str, Any]) -> str:
    """The resnet18 limits measured just before each of mservd's c=64 runs, if any."""
    limits = [_get(r.get("mservd"), "resnet18", "inprocess_limit", "throughput")
              for r in results.get("rounds") or []]
    limits = [x for x in limits if x]
    if not limits:
        return ""
    return (" The machine's speed moves from minute to minute, so mservd's resnet18 c=64 is "
            "judged against the limit measured just before it, in the same run: "
            + ", ".join(f"{x:.1f}" for x in limits) + " req/s by round.")


def plot(results: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"mservd": "tab:blue", "torchserve": "tab:orange", "naive-flask": "tab:green"}
    for ax, model in zip(axes, ("tiny", "resnet18")):
        for s in ORDER:
            entry = _get(results["systems"].get(s), model)
            if not entry:
                continue
            pts = []
            for c, r in sorted(entry.get("closed", {}).items(), key=lambda kv: int(kv[0])):
                pts.append((r["throughput"], r["p50_ms"], r["p99_ms"], f"c={c}"))
            for f, r in sorted(entry.get("open", {}).items(), key=lambda kv: float(kv[0])):
                pts.append((r["throughput"], r["p50_ms"], r["p99_ms"], f"open {f}x"))
            pts = [p for p in pts if p[1] is not None and p[2] is not None]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax.scatter(xs, [p[2] for p in pts], color=colors[s], marker="o", label=f"{s} p99")
            ax.scatter(xs, [p[1] for p in pts], color=colors[s], marker="x", label=f"{s} p50")
            for x, _, y, text in pts:
                ax.annotate(text, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        lim = _get(results, "inprocess", model, "throughput")
        if lim:
            ax.axvline(lim, color="grey", linestyle="--", linewidth=1, label="in-process limit")
        ax.set_yscale("log")
        ax.set_xlabel("right answers per second")
        ax.set_ylabel("latency (ms, log)")
        ax.set_title(f"{model}: latency vs throughput")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"mservd vs TorchServe vs naive Flask — {results['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


SKELETON = f"""# Benchmarks

{BEGIN}
{END}
"""


def section(results: dict[str, Any], png_name: str) -> str:
    mach = results["machine"]
    st = results["settings"]
    cc = results.get("client_ceiling", {})
    lines = [(f"Measured {results['date']}{' (quick run)' if results.get('quick') else ''}, "
             f"{results.get('total_seconds', '?')} s in all."), ""]
    lines.append(f"**Machine:** {mach['cpus']} CPUs ({mach['cpu']}), {mach['memory']} RAM, "
                 f"Python {mach['python']}, torch {mach['torch']} ({mach['torch_threads']} "
                 f"threads), TorchServe {mach.get('torchserve') or 'not installed'}; load average "
                 f"at start {', '.join(f'{x:.2f}' for x in mach['loadavg_at_start'])}; "
                 f"client event loop {results.get('event_loop')}.")
    lines.append("")
    lines.append(f"**Settings (all systems):** {st['workers_per_model']} workers per model, "
                 f"batch size {st['batch_size']}, max batch delay {st['max_batch_delay_ms']} ms, "
                 f"job queue {st['job_queue_size']}, loopback, no token auth. Durations: "
                 f"tiny {st['plan']['tiny_seconds']} s, resnet18 {st['plan']['resnet_seconds']} s "
                 f"per point after a {st['plan']['warmup_seconds']} s warm-up at c=8; open loop "
                 f"pool {st['plan']['open_pool']} connections; request timeout "
                 f"{st['plan']['timeout']} s.")
    lines.append("")
    for name, sys_ in results["systems"].items():
        if sys_.get("skipped"):
            lines.append(f"- {name} was skipped: {sys_['skipped']}")
        if sys_.get("error"):
            lines.append(f"- {name} failed: `{sys_['error'][:300]}`")
    if cc:
        lines.append("**Client ceiling** (the load generator against `benchmarks/trivial_server.py`"
                     "): " + "; ".join(f"{k}: {v['throughput']:,.0f} req/s, p99 {_fmt(v['p99_ms'], 2)}"
                                       " ms" for k, v in cc.items()) + ".")
        lines.append("")
    inp = results.get("inprocess", {})
    if inp:
        lines.append("**In-process limit** (the archive's handler on full batches of "
                     f"{st['batch_size']}, decode → handle → encode, one process, no server): "
                     + "; ".join(f"{k}: {v['throughput']:,.1f} req/s ({v['threads']} threads, "
                                 f"{v['batch_ms_p50']:.1f} ms per batch)" for k, v in inp.items())
                     + ", measured at the start of the run." + _limits_beside(results))
        lines.append("")
    rounds = results.get("rounds") or []
    if rounds:
        lines.append(f"**Rounds:** {len(rounds)}, each system in turn in a rotated order. Per "
                     "system and round, the load average before it and the cores other "
                     "processes used during it (a run above 0.25 is invalid and left out):")
        lines.append("")
        for n, r in enumerate(rounds, 1):
            lines.append(f"- round {n}: " + "; ".join(
                f"{name} {e.get('machine', {}).get('load1_before', '?')} / "
                f"{e.get('machine', {}).get('foreign_cores', '?')}"
                + ("" if valid(e) else " (**invalid**)") for name, e in r.items()))
        lines.append("")
    t = targets(results)
    if t:
        lines += ["### Targets (issue 18), on the medians", "", t, ""]
    lines += ["### Results", "",
              ("Every answer is checked against the in-process result for its input; a wrong "
              "answer counts as `bad_answer`, not as completed. Each figure is its median over "
              "the valid rounds; each ratio is mservd's figure over the other system's in the "
              "same round, its median and (range) over the rounds."), "", table(results), ""]
    cpu = cpu_table(results)
    if cpu:
        lines += ["### Where the CPU went at tiny c=64 (cores used, per process role)", "", cpu,
                  ""]
    lines += [f"![latency versus throughput]({png_name})", ""]
    return "\n".join(lines)


def render(results: dict[str, Any], repo: Path) -> list[Path]:
    quick = results.get("quick")
    if quick:
        md = repo / "benchmarks" / "results" / "BENCHMARKS-quick.md"
        png = repo / "benchmarks" / "results" / "latency_throughput-quick.png"
        png_ref = png.name
    else:
        md = repo / "BENCHMARKS.md"
        png = repo / "benchmarks" / "latency_throughput.png"
        png_ref = "benchmarks/latency_throughput.png"
    md.parent.mkdir(parents=True, exist_ok=True)
    text = md.read_text() if md.exists() else SKELETON
    if BEGIN not in text or END not in text:
        text = text.rstrip() + "\n\n" + BEGIN + "\n" + END + "\n"
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    md.write_text(before + BEGIN + "\n" + section(results, png_ref) + END + after)
    written = [md]
    if plot(results, png):
        written.append(png)
    return written
