"""Progress lines for a run's events (``securefed run`` prints them unless ``--quiet``; the estimators with
``verbose=1``). One line per step that takes more than a moment, with the elapsed time, on standard error.

Besides the coordinator's events, an in-process run passes each site's ``"placement"`` events (``site``, ``records``,
``done`` / ``total`` iterations of :func:`securefed.embedding.placement.place_refine`) to the same callback."""

from __future__ import annotations

import sys
import time

__all__ = ["ProgressPrinter"]


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
            self.say("audit", f"membership attack on the landmarks: AUC {ev['auc']:.3f}, empirical ε ≥ "
                              f"{ev['empirical_epsilon']:.3f} → {ev['verdict']}")
        elif kind == "embedding":
            self.say("embedding", f"the coordinator mapped the {ev['landmarks']} landmarks; each site now places its "
                                  "own records")
        elif kind == "rows":
            self.say("embedding", f"{ev['records']} rows from {len(ev['sites'])} sites (the paper's mode); computing the map")
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
