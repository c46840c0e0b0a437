"""The plots of docs/benchmarks.md, drawn from the figures each benchmark
prints on its `BENCH-DATA SCRIPT JSON` line.

bench/run.py draws them outside the lab VM, next to the document, from the
same run that wrote the tables: a plot never shows figures the table does not.
"""

import json
import re
from pathlib import Path

DATA_LINE = re.compile(r"^BENCH-DATA (\S+) (.+)$", re.M)


def data_line(script, data):
    """The line a benchmark prints for its plot."""
    return f"BENCH-DATA {script} {json.dumps(data)}"


def bench_data(output):
    """{script: data} of every BENCH-DATA line in a run's output."""
    return {m[1]: json.loads(m[2]) for m in DATA_LINE.finditer(output)}


def image_name(script):
    """Where a benchmark's plot goes, relative to docs/benchmarks.md."""
    return f"benchmarks/{Path(script).stem}.png"


def image_link(script, title):
    return f"![{title}]({image_name(script)})"


def draw_all(output, doc_folder):
    """A PNG for every benchmark with data in `output`; returns the files written."""
    # matplotlib only here: it costs seconds to import, and only plots need it.
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    written = []
    for script, data in bench_data(output).items():
        drawer = DRAWERS.get(script)
        if drawer is None:
            continue
        path = Path(doc_folder) / image_name(script)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure = drawer(pyplot, data)
        figure.savefig(path, dpi=100, bbox_inches="tight")
        pyplot.close(figure)
        written.append(path)
    return written


def _dataplane(pyplot, data):
    """Throughput against workers: direct routing climbs, proxies stay at the link."""
    figure, axes = pyplot.subplots(figsize=(7, 4))
    paths = {}
    for path, count, m in data["rows"]:
        paths.setdefault(path, []).append((count, m["rate"] / 1e6))
    # The proxies lie on one another at the balancer's link: a marker each tells them apart.
    for (path, points), marker in zip(paths.items(), "osv^Dx"):
        points.sort()
        axes.plot([c for c, _ in points], [r for _, r in points], marker=marker, label=path)
    link = data["link_rate"] / 1e6
    axes.axhline(link, color="grey", linestyle="--", label="the balancer's link")
    axes.set_xlabel("workers")
    axes.set_ylim(bottom=0)
    axes.set_ylabel("MB/s at the client")
    axes.set_title("Direct routing against proxies, every link capped alike")
    axes.legend()
    return figure


def _failover(pyplot, data):
    """Failover and detection times per configuration, every run a dot."""
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    figure, (left, right) = pyplot.subplots(1, 2, figsize=(9, 4))
    for axes, key, title in ((left, "failover", "the VIP on the other balancer after the cut"),
                             (right, "detection", "a dead worker out of the pool")):
        names = [n for n, f in data.items() if f[key]]
        measured = [v for n in names for v in data[n][key] if v is not None]
        for x, name in enumerate(names):
            values = [v for v in data[name][key] if v is not None]
            axes.scatter([x] * len(values), values, alpha=0.6)
            never = len(data[name][key]) - len(values)
            if never:
                axes.annotate(f"{never} never", (x, 0.02), xycoords=("data", "axes fraction"),
                              ha="center")
        axes.set_xticks(range(len(names)), names, rotation=20)
        # keepalived's defaults take a minute where lbctl takes a second or two.
        if measured and max(measured) > 10 * min(measured):
            axes.set_yscale("log")
            # Plain seconds (0.5, 2, 30) rather than powers of ten.
            low, high = min(measured), max(measured)
            axes.set_yticks([t for t in (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200)
                             if low / 1.5 <= t <= high * 1.5])
            axes.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            axes.yaxis.set_minor_formatter(NullFormatter())
        axes.set_ylabel("seconds")
        axes.set_title(title)
    return figure


def _schedulers(pyplot, data):
    """Requests per second and p99 latency per scheduler, with one slow worker."""
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(9, 4))
    names = [name for name, _ in data["rows"]]
    left.bar(names, [m["rate"] for _, m in data["rows"]])
    left.set_ylabel("requests/s")
    left.set_title("throughput")
    right.bar(names, [m["p99"] for _, m in data["rows"]], color="tab:orange")
    right.set_ylabel("ms")
    right.set_title("p99 latency")
    return figure


DRAWERS = {"bench/dataplane.py": _dataplane, "bench/failover.py": _failover,
           "bench/schedulers.py": _schedulers}
