"""Progress of a run, from the coordinator's events, on standard error.

* :class:`ProgressPrinter` — one line per step that takes more than a moment, with the elapsed time (``securefed
  run`` prints them unless ``--quiet``; the estimators with ``verbose=1``): readable in a log.
* :class:`ProgressBar` — one line redrawn in place: the stage, a bar over the whole job, the elapsed time (the
  estimators' default ``verbose="auto"`` on a terminal, like umap-learn's and openTSNE's ``verbose``).

:func:`progress_for` picks one from an estimator's ``verbose``: ``"auto"`` (the default) draws the bar when standard
error is a terminal and prints nothing otherwise (logs, pipes, tests); ``1`` / ``True`` prints the lines; ``0`` /
``False`` nothing.

Besides the coordinator's events, an in-process run passes each site's ``"placement"`` events (``site``, ``records``,
``done`` / ``total`` iterations of :func:`securefed.embedding.placement.place_refine`) to the same callback."""

from __future__ import annotations

import sys
import time

__all__ = ["ProgressPrinter", "ProgressBar", "progress_for"]


class ProgressPrinter:
    """``on_event`` callback of the coordinator that prints a line per stage (and about ten per landmark stage)."""

    def __init__(self, stream=None, *, every: int | None = None, placement_every: float = 10.0):
        self.stream = sys.stderr if stream is None else stream
        self.every = every
        self.placement_every = float(placement_every)
        self.t0 = time.perf_counter()
        self._last_placement = self.t0

    def say(self, stage: str, text: str) -> None:
        print(f"[{stage}] {text} ({time.perf_counter() - self.t0:.1f} s)", file=self.stream, flush=True)

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "hello":
            self.say("sites", f"{len(ev['sites'])} sites answered: {sum(ev['sizes'])} records for the landmarks")
        elif kind == "round":
            s, total = ev["round"], ev["rounds"]
            every = self.every or max(1, total // 10)
            if s == 1 or s % every == 0 or s == total:
                extra = "" if ev.get("mmd_at_start") is None else f", MMD {ev['mmd_at_start']:.4g}"
                extra += "" if ev.get("epsilon") is None else f", ε spent {ev['epsilon']:.3f}"
                self.say("landmarks", f"round {s}/{total}{extra}")
        elif kind == "cells":
            self.say("landmarks", f"cells round {ev['round']}: {ev['cells']} cells")
        elif kind == "audit":
            self.say(
                "audit",
                f"membership attack on the landmarks: AUC {ev['auc']:.3f}, empirical ε ≥ "
                f"{ev['empirical_epsilon']:.3f} → {ev['verdict']}",
            )
        elif kind == "embedding":
            self.say(
                "embedding",
                f"the coordinator mapped the {ev['landmarks']} landmarks; each site now places its own records",
            )
        elif kind == "rows":
            self.say(
                "embedding", f"{ev['records']} rows from {len(ev['sites'])} sites (the paper's mode); computing the map"
            )
        elif kind == "placement":  # a site's own placement (in process): when it ends, and every ~10 s while it runs
            now = time.perf_counter()
            if ev["done"] == 0:  # a site starts: the clock of its "placing" lines starts with it
                self._last_placement = now
            elif ev["done"] == ev["total"] or now - self._last_placement >= self.placement_every:
                self._last_placement = now
                what = "placed" if ev["done"] == ev["total"] else f"placing ({ev['done']}/{ev['total']} iterations)"
                self.say("embedding", f"{ev['site']} {what} its {ev['records']} records")
        elif kind == "embedded":
            self.say("embedding", f"done ({ev['what']})")
        elif kind == "readmit":
            self.say("sites", f"re-admitted {', '.join(ev['sites'])} {ev['at']}")
        elif kind == "done":
            self.say("run", f"done: {ev['round_trips']} request/reply round trips")


class ProgressBar:
    """``on_event`` callback that redraws one line on a terminal: ``[securefed] ███████░░░ landmarks: round 12/60
    (3.1 s)``. The bar covers the whole job — sites, landmarks, audit, placement — and ends with a newline."""

    #: where each stage starts and ends on the bar (the landmark rounds fill their span as they go)
    SPANS = {
        "sites": (0.0, 0.05),
        "landmarks": (0.05, 0.6),
        "audit": (0.6, 0.65),
        "embedding": (0.65, 0.98),
        "done": (1.0, 1.0),
    }

    def __init__(self, stream=None, *, width: int = 24):
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.t0 = time.perf_counter()
        self._last = 0
        self._closed = False

    def draw(self, stage: str, text: str, within: float | None = None) -> None:
        lo, hi = self.SPANS.get(stage, (0.0, 0.0))
        frac = lo + (hi - lo) * (0.0 if within is None else min(max(within, 0.0), 1.0))
        full = int(round(frac * self.width))
        line = (
            f"[securefed] {'█' * full}{'░' * (self.width - full)} {stage}: {text} "
            f"({time.perf_counter() - self.t0:.1f} s)"
        )
        pad = " " * max(0, self._last - len(line))
        self.stream.write("\r" + line + pad)
        self.stream.flush()
        self._last = len(line)

    def close(self) -> None:
        if not self._closed and self._last:
            self.stream.write("\n")
            self.stream.flush()
        self._closed = True

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "hello":
            self.draw("sites", f"{len(ev['sites'])} sites, {sum(ev['sizes'])} records for the landmarks")
        elif kind == "round":
            self.draw("landmarks", f"round {ev['round']}/{ev['rounds']}", ev["round"] / max(ev["rounds"], 1))
        elif kind == "cells":
            self.draw("landmarks", f"cells round {ev['round']}: {ev['cells']} cells", min(ev["round"] / 12.0, 1.0))
        elif kind == "audit":
            self.draw("audit", f"membership AUC {ev['auc']:.3f} → {ev['verdict']}")
        elif kind in ("embedding", "rows"):
            self.draw("embedding", "the sites place their records" if kind == "embedding" else "mapping the rows")
        elif kind == "embedded":
            self.draw("embedding", "done", 1.0)
        elif kind == "done":
            self.draw("done", f"{ev['round_trips']} request/reply round trips")
            self.close()


def progress_for(verbose, stream=None):
    """The progress callback of an estimator's ``verbose`` (see the module docstring), or None for silence."""
    from .errors import ConfigError, bad_value

    stream = sys.stderr if stream is None else stream
    if isinstance(verbose, str):
        if verbose != "auto":
            raise ConfigError(
                bad_value(
                    "verbose",
                    verbose,
                    "use 'auto' (a progress bar on a terminal, silent otherwise), 1 (a line per stage) or 0 (silent)",
                )
            )
        isatty = getattr(stream, "isatty", None)
        return ProgressBar(stream) if callable(isatty) and isatty() else None
    if not isinstance(verbose, (bool, int)) or verbose < 0:
        raise ConfigError(bad_value("verbose", verbose, "use 'auto', 1 or 0"))
    return ProgressPrinter(stream) if verbose else None
