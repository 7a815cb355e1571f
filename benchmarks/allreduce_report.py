"""Tables and plot of benchmarks/allreduce.py (the measuring is there and in allreduce_worker.py).

Backends, in the default order of the run and of the table columns (shared memory first, then TCP):
  pycyxwiz      cx.distributed with CYXWIZ_TRANSPORT unset (auto: shared memory when every rank is on one host)
  mpi-shm       Open MPI, shared memory (btl vader or sm, and self)
  pycyxwiz-tcp  cx.distributed with CYXWIZ_TRANSPORT=tcp (the TCP ring)
  mpi           Open MPI over TCP loopback (btl tcp, self)
  gloo          torch.distributed's Gloo over TCP loopback
"""

import statistics
import textwrap

BACKENDS = ["pycyxwiz", "pycyxwiz-shared", "mpi-shm", "pycyxwiz-tcp", "mpi", "gloo"]
LABEL = {"pycyxwiz": "pycyxwiz", "pycyxwiz-shared": "pycyxwiz shared", "mpi-shm": "Open MPI shm",
         "pycyxwiz-tcp": "pycyxwiz TCP",
         "mpi": "Open MPI TCP", "gloo": "Gloo"}
# Ratio columns "A/B" = B's time / A's time: pycyxwiz (auto, shared memory) against every other backend,
# then pycyxwiz's TCP ring against the two TCP libraries (the comparison of the earlier, TCP-only results).
RATIOS = [("pycyxwiz", "mpi-shm"), ("pycyxwiz-shared", "pycyxwiz"), ("pycyxwiz-shared", "mpi-shm"),
          ("pycyxwiz", "pycyxwiz-tcp"), ("pycyxwiz", "mpi"), ("pycyxwiz", "gloo"),
          ("pycyxwiz-tcp", "mpi"), ("pycyxwiz-tcp", "gloo")]
COLORS = {"pycyxwiz": "tab:red", "pycyxwiz-shared": "tab:brown", "mpi-shm": "tab:purple",
          "pycyxwiz-tcp": "tab:orange", "mpi": "tab:green",
          "gloo": "tab:blue"}


def human(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def busbw(nbytes, us, world):
    if not us or us <= 0:
        return None
    return nbytes / (us * 1e-6) / 1e9 * 2 * (world - 1) / world


def md_table(headers, rows):
    cols = len(headers)
    w = [max(len(str(headers[c])), *(len(str(r[c])) for r in rows)) for c in range(cols)]
    line = lambda cells: "| " + " | ".join(str(v).rjust(w[i]) if i else str(v).ljust(w[i]) for i, v in enumerate(cells)) + " |"  # noqa: E731
    sep = "| " + " | ".join(("-" * (w[i] - 1) + ":") if i else "-" * w[i] for i in range(cols)) + " |"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def fmt_us(v):
    if v is None:
        return "—"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def fmt_bw(v):
    if v is None:
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}"


def fmt_ratio(v):
    return "—" if v is None else f"{v:.2f}"


def transports(runs, backend):
    """The transports the ranks of `backend` reported (get_config().transport; the btl for Open MPI)."""
    out = []
    for r in runs:
        t = r["backend"] == backend and (r.get("ready") or {}).get("transport")
        if t and t not in out:
            out.append(t)
    return out


def labels(runs, backends):
    """Column labels: pycyxwiz says which transport its ranks reported; a TCP run that did not get TCP says so."""
    out = dict(LABEL)
    t = transports(runs, "pycyxwiz")
    if t:
        out["pycyxwiz"] = f"pycyxwiz ({'/'.join(t)})"
    t = transports(runs, "pycyxwiz-tcp")
    if t and t != ["tcp"]:
        out["pycyxwiz-tcp"] = f"pycyxwiz TCP (got {'/'.join(t)})"
    return {b: out[b] for b in backends}


def summarize(runs, backends, worlds, sizes):
    """(backend, world, size) -> per-repeat lists and medians."""
    s = {}
    for b in backends:
        for w in worlds:
            for n in sizes:
                reps = [r for r in runs if r["backend"] == b and r["world_size"] == w]
                res = [r["results"][n] for r in reps if n in r["results"]]
                errs = [r["errors"][n] for r in reps if n in r["errors"]]
                e = {"median_us": [x["median_us"] for x in res], "b2b_us": [x["b2b_us"] for x in res],
                     "iters": [x["iters"] for x in res], "errors": errs}
                e["med_us"] = statistics.median(e["median_us"]) if res else None
                e["med_b2b_us"] = statistics.median(e["b2b_us"]) if res else None
                e["busbw"] = busbw(n, e["med_us"], w)
                e["b2b_busbw"] = busbw(n, e["med_b2b_us"], w)
                s[(b, w, n)] = e
    return s


def ratio_list(s, a, b, w, n):
    """Per repeat: b's median time / a's (= a's busbw / b's busbw); above 1, a is faster."""
    x, y = s[(a, w, n)]["median_us"], s[(b, w, n)]["median_us"]
    return [q / p for p, q in zip(x, y) if p]


def ratio_pairs(measured):
    return [(a, b) for a, b in RATIOS if a in measured and b in measured]


def legend(lab):
    cx = lab.get("pycyxwiz", "pycyxwiz")
    text = (
        'Per world size: (1) "us" = median time of one call in microseconds (barrier before each call; a call\'s '
        'time is the slowest rank\'s); "busbw" = bus bandwidth in GB/s (1e9 B/s) from that median: bytes / time '
        '* 2(N-1)/N. (2) "A/B" = B\'s median time / A\'s = A\'s busbw / B\'s busbw: above 1, A is faster (at 4 KiB '
        'read it as the ratio of times); with repeats, the range over the repeats follows in brackets. '
        f'"pycyxwiz" is the run with CYXWIZ_TRANSPORT unset (auto), column "{cx}" (in brackets: the transport its '
        'ranks reported, get_config().transport); "pycyxwiz TCP" the run with CYXWIZ_TRANSPORT=tcp. '
        '(3) "b2b busbw" = busbw from calls back to back without barriers (total time / calls, slowest rank). '
        '"—": not measured; FAILED: see the errors below.')
    return textwrap.fill(text, 110)


def print_tables(s, backends, measured, lab, worlds, sizes, repeats, run_lookup):
    """backends: the table's columns (measured ones and skipped ones); measured: those that ran."""
    pairs = ratio_pairs(measured)
    for w in worlds:
        print(f"\n### World size {w}" + (f" (median of {repeats} repeats)" if repeats > 1 else ""))

        headers = ["size (B)"]
        for b in backends:
            headers += [f"{lab[b]} us", f"{lab[b]} busbw"]
        rows = []
        for n in sizes:
            row = [f"{n} ({human(n)})"]
            for b in backends:
                e = s[(b, w, n)]
                if e["med_us"] is None:
                    why = "skipped" if run_lookup.get((b, w)) == "skipped" else ("FAILED" if e["errors"] else "—")
                    row += [why, "—"]
                else:
                    row += [fmt_us(e["med_us"]), fmt_bw(e["busbw"])]
            rows.append(row)
        print(f"\nMedian time per call (us) and busbw (GB/s), {w} ranks:\n")
        print(md_table(headers, rows))

        if pairs:
            rows = []
            for n in sizes:
                row = [f"{n} ({human(n)})"]
                for a, b in pairs:
                    r = ratio_list(s, a, b, w, n)
                    cell = fmt_ratio(statistics.median(r)) if r else "—"
                    if len(r) > 1:
                        cell += f" ({fmt_ratio(min(r))}..{fmt_ratio(max(r))})"
                    row.append(cell)
                rows.append(row)
            print(f"\nRatios A/B = B's time / A's time (above 1: A is faster), {w} ranks:\n")
            print(md_table(["size (B)"] + [f"{LABEL[a]}/{LABEL[b]}" for a, b in pairs], rows))

        rows = []
        for n in sizes:
            row = [f"{n} ({human(n)})"]
            for b in backends:
                row.append(fmt_bw(s[(b, w, n)]["b2b_busbw"]))
            rows.append(row)
        print(f"\nBack-to-back busbw (GB/s, no barriers), {w} ranks:\n")
        print(md_table(["size (B)"] + [f"{lab[b]} b2b busbw" for b in backends], rows))

        if repeats > 1:
            rows = []
            for n in sizes:
                row = [f"{n} ({human(n)})"]
                for b in measured:
                    bws = [busbw(n, t, w) for t in s[(b, w, n)]["median_us"]]
                    row.append(f"{fmt_bw(min(bws))}..{fmt_bw(max(bws))}" if bws else "—")
                rows.append(row)
            print(f"\nbusbw min..max over the {repeats} repeats, {w} ranks:\n")
            print(md_table(["size (B)"] + [f"{lab[b]} busbw" for b in measured], rows))


def plot(path, s, backends, lab, worlds, sizes, loop, log=print):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot drawn")
        return False
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D"]
    fig, ax = plt.subplots(figsize=(10, 6))
    for b in backends:
        for i, w in enumerate(worlds):
            xs = [n for n in sizes if s[(b, w, n)]["busbw"] is not None]
            if xs:
                ax.plot(xs, [s[(b, w, n)]["busbw"] for n in xs], linestyle=styles[i % 4], marker=markers[i % 4],
                        markersize=4, color=COLORS.get(b), label=f"{lab[b]}, {w} ranks")
    if loop.get("one_stream_GBps"):
        ax.axhline(loop["one_stream_GBps"], color="gray", linestyle="-", linewidth=1,
                   label=f"TCP loopback, one stream ({loop['one_stream_GBps']:.2f} GB/s)")
    if loop.get("both_ways_per_direction_GBps"):
        ax.axhline(loop["both_ways_per_direction_GBps"], color="gray", linestyle="--", linewidth=1,
                   label=f"TCP loopback, both ways, per direction ({loop['both_ways_per_direction_GBps']:.2f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(n).replace(" ", "") for n in sizes])
    ax.set_xlabel("message size (float32, SUM, in place)")
    ax.set_ylabel("busbw, GB/s (median call, barrier before each)")
    ax.set_title("All-reduce bus bandwidth on one machine: shared memory and TCP loopback")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
