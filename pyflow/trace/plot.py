"""The trace's timeline as a PNG, with matplotlib (optional: ``pip install matplotlib``).

One horizontal band per vm stream, first stream on top.  The upper half of a
band shows compute (started -> launched), labelled with the instruction's name
where it is wide enough.  The lower half shows the waiting lanes of
``chrome.py``: waiting for dependences, queued on worker, waiting for the device.
"""

from __future__ import annotations

from pyflow.trace.chrome import DEVICE, QUEUED, WAIT_DEPENDENCES, assign_lanes, phases

__all__ = ["plot", "matplotlib_classes"]

COLOURS = {"compute": "tab:blue", WAIT_DEPENDENCES[0]: "0.75", QUEUED[0]: "tab:orange",
           DEVICE[0]: "tab:purple", "failed": "tab:red"}


def matplotlib_classes(drawer: str, without: str):
    """``(Figure, FigureCanvasAgg, Patch)``, imported on first use; else an ``ImportError`` that says
    ``drawer`` needs matplotlib, how to install it and what works without it (``without``)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(f"{drawer} draws with matplotlib, which is not installed: "
                          f"pip install matplotlib (or pip install 'pyflow[trace]'); {without}") from None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    return Figure, FigureCanvasAgg, Patch


def plot(records, path) -> str:
    """Draw ``records`` (``InstructionRecord`` list) to a PNG at ``path``; returns the path."""
    Figure, FigureCanvasAgg, Patch = matplotlib_classes("tracer.plot()",
                                                        "tracer.save(path) writes the Perfetto JSON without it")
    path = str(path)
    records = sorted(records, key=lambda r: (r.received, r.serial))
    streams = [s for _, s in sorted({(r.stream_id, r.stream) for r in records})]
    origin = min((r.received for r in records), default=0.0)
    span = max((r.released for r in records), default=origin) - origin

    def ms(t: float) -> float:
        return (t - origin) * 1e3

    figure = Figure(figsize=(12, 1.0 + 1.1 * max(len(streams), 1)), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for row, stream in enumerate(streams):
        mine = [r for r in records if r.stream == stream]
        bars: dict = {}
        for r in mine:
            started = r.started if r.started is not None else r.launched
            kind = "failed" if r.failed else "compute"
            bars.setdefault((kind, row + 0.05, 0.4), []).append((ms(started), ms(r.launched) - ms(started)))
            if span > 0 and (r.launched - started) > 0.04 * span:
                axes.text((ms(started) + ms(r.launched)) / 2, row + 0.25, r.name, ha="center", va="center",
                          fontsize=7, color="white", clip_on=True)
        waits = [phases(r) for r in mine]
        lanes = assign_lanes([(p[0][1], p[-1][2]) for p in waits])
        height = 0.4 / (max(lanes) + 1)
        for record_phases, lane in zip(waits, lanes):
            for (name, _, _), start, end in record_phases:
                bars.setdefault((name, row + 0.5 + lane * height, height * 0.9), []).append(
                    (ms(start), ms(end) - ms(start)))
        for (kind, y, h), spans in bars.items():
            # a thin edge of the same colour keeps very short bars visible
            axes.broken_barh(spans, (y, h), facecolors=COLOURS[kind], edgecolors=COLOURS[kind], linewidth=0.5)
    axes.set_yticks([row + 0.45 for row in range(len(streams))], streams)
    axes.set_ylim(max(len(streams), 1), 0)
    axes.set_xlim(0, max(span * 1e3, 1e-3))
    axes.set_xlabel("ms since the first instruction was received")
    axes.set_title(f"pyflow VM trace: {len(records)} instructions on {len(streams)} streams "
                   "(top of each band: compute; bottom: waiting lanes)")
    figure.legend(handles=[Patch(color=COLOURS[k], label=k) for k in
                           ("compute", WAIT_DEPENDENCES[0], QUEUED[0], DEVICE[0])],
                  loc="lower center", ncol=4, fontsize=8, frameon=False)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(path, format="png")
    return path
