"""The campaign chart: coverage and corpus size over time, with the findings marked.

Drawn with matplotlib on its non-interactive Agg canvas, without pyplot, so no global backend or
figure state is touched. matplotlib is imported only when a chart is drawn: importing the campaign
machinery stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COVERAGE_COLOR = "tab:blue"
CORPUS_COLOR = "tab:orange"
FINDING_COLOR = "tab:red"


def finding_times(timeline: list[dict]) -> list[float]:
    """Seconds at which the number of findings grew (one entry per new finding)."""
    times, seen = [], 0
    for sample in timeline:
        new = sample["findings"] - seen
        times += [sample["t"]] * max(new, 0)
        seen = max(seen, sample["findings"])
    return times


def coverage_figure(timeline: list[dict], title: str) -> Figure:
    """Coverage (left axis, edges) and corpus size (right axis, files) against seconds since the start;
    a dashed line at each moment a finding appeared."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    coverage = figure.add_subplot()
    corpus = coverage.twinx()
    seconds = [sample["t"] for sample in timeline]
    lines = coverage.plot(seconds, [s["cov"] for s in timeline], color=COVERAGE_COLOR,
                          label="coverage (edges)")
    lines += corpus.plot(seconds, [s["corpus"] for s in timeline], color=CORPUS_COLOR,
                         label="corpus size (files)")
    findings = finding_times(timeline)
    for index, when in enumerate(findings):
        mark = coverage.axvline(when, color=FINDING_COLOR, linestyle="--", linewidth=1,
                                label=f"finding ({len(findings)} in all)" if index == 0 else None)
        if index == 0:
            lines.append(mark)
    coverage.set_xlabel("time since start (s)")
    coverage.set_ylabel("coverage (edges)", color=COVERAGE_COLOR)
    corpus.set_ylabel("corpus size (files)", color=CORPUS_COLOR)
    coverage.set_ylim(bottom=0)
    corpus.set_ylim(bottom=0)
    coverage.grid(alpha=0.3)
    coverage.set_title(title)
    coverage.legend(handles=lines, loc="lower right")
    return figure


def write_plot(path, timeline: list[dict], title: str) -> None:
    """The chart of ``timeline`` (samples with ``t``, ``cov``, ``corpus``, ``findings``) as a PNG."""
    coverage_figure(timeline, title).savefig(path, format="png")
