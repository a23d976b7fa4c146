"""The persisted privacy ledger: append-only, fsync'd JSON lines, written before a release leaves a site.

File format (one JSON object per line, UTF-8, ``\\n``-terminated)
-----------------------------------------------------------------
* line 1, ``{"type": "header", "v": 1, "run_id", "delta", "accountant", "budget_epsilon", "site_budgets", "created"}``
* ``{"type": "release", "id", "site", "round", "step", "attempt", "mechanism", "sensitivity", "sigma",
  "noise_multiplier", "sample_rate", "noise", "noise_source", "seed_tag", "release_digest",
  "accountant_state", "time", ...}`` — one per noisy release, written and fsync'd **before** the noisy
  value is returned to the caller (write-ahead). ``noise_multiplier`` is the effective ``σ/Δ`` the
  release is accounted at (for distributed noise: the worst case the budget check assumed).
* ``{"type": "settle", "id", "round", "step", "survivors", "releases": {release_id: noise_multiplier}}``
  — written by the server side after a distributed-noise aggregation: the noise multiplier each
  surviving site's release actually had, given the survivors (replaces the worst-case value).

Semantics
---------
* **Budgets.** ``budget_epsilon`` applies to every site; ``site_budgets`` may make a site stricter. A
  record lives at one site, so the run's (global) ε is the maximum over sites (parallel composition);
  ``spent()`` returns it. A release that would push its site over budget raises
  :class:`~securefed.errors.BudgetExceededError` **before** anything is written or returned.
* **Deterministic ids.** ``{run_id}/site{p}/round{s}/step{t}/attempt{a}``. A redo of a release with
  seeded noise that reproduces the same noisy value (same seed, same input — checked by
  ``release_digest``) is idempotent: the existing event is reused, nothing is counted twice. A redo
  with fresh noise (secure mode, another seed, or a different input) is a new release: it gets the
  next attempt number and is counted again (conservative and correct: both values were sent).
* **Crash safety.** Each append is ``write`` + ``fsync``; the file and its directory are fsync'd on
  creation. On reopening, a torn last line (no trailing newline) is handled so: if it parses as a
  complete event, it is **kept and counted** (it may have been the last thing written); if it does
  not parse, the crash happened while writing it, hence before the release was returned (write-ahead),
  so nothing was sent — the fragment is moved to ``<path>.torn`` and dropped. Any other unparseable
  line, or a header of another run, raises :class:`~securefed.errors.LedgerError`.
* **Resume.** Reopening an existing ledger restores every site's spent budget.
* **Single writer.** One process appends to a ledger at a time (the simulator); a real deployment
  keeps one ledger per site plus the server's settlements.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from collections import Counter, defaultdict

import numpy as np

from ..errors import BudgetExceededError, ConfigError, LedgerError, bad_value
from .accountants import ACCOUNTANTS, check_delta, check_epsilon, get_accountant

__all__ = ["PrivacyLedger", "release_id", "array_digest"]

_VERSION = 1
_TOL = 1e-9


def release_id(run_id: str, site: int, round, step, attempt: int) -> str:
    """Deterministic event id ``{run_id}/site{p}/round{s}/step{t}/attempt{a}``."""
    return f"{run_id}/site{site}/round{round}/step{step}/attempt{attempt}"


def array_digest(a: np.ndarray) -> str:
    """SHA-256 (first 32 hex digits) of an array's float64 bytes — identifies an exact redo."""
    b = np.ascontiguousarray(np.asarray(a, dtype=np.float64)).tobytes()
    return hashlib.sha256(b).hexdigest()[:32]


def _fsync_dir(path: str) -> None:
    dfd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class PrivacyLedger:
    """Append-only, fsync'd JSON-lines privacy ledger with per-site budgets (see module docstring).

    Parameters
    ----------
    path : str or None
        File to write; ``None`` keeps the ledger in memory (same checks, nothing persisted).
    run_id : str
        Identifies the run; reopening a file of another run raises :class:`LedgerError`.
    budget_epsilon : float, optional
        ε budget per record (every site, hence also global). ``None``: no budget, only accounting.
    delta : float
        The δ at which ε is reported and budgets are checked.
    accountant : {"exact", "prv", "rdp", "paper"}
        Accountant used for spent ε and budget checks.
    site_budgets : dict, optional
        ``{site: epsilon}`` stricter per-site budgets.
    """

    def __init__(self, path, run_id: str, budget_epsilon=None, delta: float = 1e-5, accountant: str = "exact",
                 site_budgets=None):
        if not isinstance(run_id, str) or not run_id or "/" in run_id:
            raise ConfigError(bad_value("run_id", run_id, "use a non-empty string without '/'"))
        if accountant not in ACCOUNTANTS:
            raise ConfigError(bad_value("accountant", accountant, f"use one of {', '.join(ACCOUNTANTS)}"))
        self.path = None if path is None else os.fspath(path)
        self.run_id = run_id
        self.delta = check_delta(delta)
        self.accountant_name = accountant
        self.accountant = get_accountant(accountant)
        self.budget_epsilon = None if budget_epsilon is None else check_epsilon(budget_epsilon)
        self.site_budgets = {int(k): check_epsilon(v) for k, v in (site_budgets or {}).items()}
        self.recovered: dict = {}
        self._events: list[dict] = []
        self._by_id: dict[str, dict] = {}
        self._by_coord: dict[tuple, list[dict]] = defaultdict(list)
        self._z: dict[str, float] = {}  # release id -> effective noise multiplier (after settlement)
        self._plan: dict[int, tuple[float, float, int, float]] = {}
        if self.path is not None and os.path.exists(self.path):
            self._load()
        else:
            self._header = {"type": "header", "v": _VERSION, "run_id": run_id, "delta": self.delta,
                            "accountant": accountant, "budget_epsilon": self.budget_epsilon,
                            "site_budgets": {str(k): v for k, v in self.site_budgets.items()},
                            "created": _dt.datetime.now(_dt.timezone.utc).isoformat()}
            if self.path is not None:
                self._create()

    # ------------------------------------------------------------------ persistence

    def _create(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise LedgerError(bad_value("path", self.path, "was created concurrently; use one writer per ledger")) from None
        try:
            os.write(fd, (json.dumps(self._header, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(self.path)

    def _append(self, event: dict) -> None:
        line = (json.dumps(event, sort_keys=True, allow_nan=False) + "\n").encode()
        if self.path is not None:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                n = os.write(fd, line)
                if n != len(line):
                    raise LedgerError(bad_value("path", self.path, "short write to the ledger; check free disk space"))
                os.fsync(fd)
            finally:
                os.close(fd)
        self._ingest(event)

    def _load(self) -> None:
        with open(self.path, "rb") as fh:
            data = fh.read()
        if not data:
            raise LedgerError(bad_value("path", self.path, "is an empty file, not a ledger; remove it or use another path"))
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        parsed = []
        for i, raw in enumerate(lines):
            try:
                parsed.append(json.loads(raw))
            except (ValueError, UnicodeDecodeError):
                raise LedgerError(bad_value(f"{self.path}:line {i + 1}", raw[:60], "corrupt ledger line (not the last one); "
                                            "restore the file from backup — spent budget cannot be reconstructed")) from None
        if tail:
            try:
                ev = json.loads(tail)
                if not isinstance(ev, dict) or "type" not in ev:
                    raise ValueError
            except (ValueError, UnicodeDecodeError):
                # torn during the write: the release had not been returned yet (write-ahead) -> drop it
                with open(self.path + ".torn", "ab") as fh:
                    fh.write(tail + b"\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                with open(self.path, "r+b") as fh:
                    fh.truncate(len(data) - len(tail))
                    fh.flush()
                    os.fsync(fh.fileno())
                self.recovered = {"torn_last_line": "discarded", "bytes": len(tail), "moved_to": self.path + ".torn"}
            else:
                with open(self.path, "ab") as fh:
                    fh.write(b"\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                parsed.append(ev)
                self.recovered = {"torn_last_line": "kept_and_counted"}
        if not parsed or not isinstance(parsed[0], dict) or parsed[0].get("type") != "header":
            raise LedgerError(bad_value("path", self.path, "has no ledger header; it is not a securefed ledger"))
        h = parsed[0]
        if h.get("run_id") != self.run_id:
            raise LedgerError(bad_value("run_id", self.run_id, f"the ledger at {self.path} belongs to run {h.get('run_id')!r}; "
                                        "use that run id or another ledger path"))
        if h.get("v") != _VERSION:
            raise LedgerError(bad_value("ledger version", h.get("v"), f"this securefed reads version {_VERSION}"))
        for key, mine in (("delta", self.delta), ("accountant", self.accountant_name)):
            if h.get(key) != mine:
                raise LedgerError(bad_value(key, mine, f"the ledger was started with {key}={h.get(key)!r}; resume with the same value"))
        hb = h.get("budget_epsilon")
        if self.budget_epsilon is not None and hb is not None and not math.isclose(hb, self.budget_epsilon):
            raise LedgerError(bad_value("budget_epsilon", self.budget_epsilon, f"the ledger was started with budget {hb}; a budget cannot change mid-run"))
        self.budget_epsilon = hb if hb is not None else self.budget_epsilon
        hs = {int(k): float(v) for k, v in (h.get("site_budgets") or {}).items()}
        self.site_budgets = {**hs, **self.site_budgets}
        self._header = h
        for ev in parsed[1:]:
            self._ingest(ev)

    def _ingest(self, ev: dict) -> None:
        t = ev.get("type")
        if t == "release":
            self._events.append(ev)
            self._by_id[ev["id"]] = ev
            self._by_coord[(ev["site"], ev["round"], ev["step"])].append(ev)
            self._z[ev["id"]] = float(ev["noise_multiplier"])
        elif t == "settle":
            self._events.append(ev)
            self._by_id[ev["id"]] = ev
            for rid, z in ev["releases"].items():
                if rid in self._z:
                    self._z[rid] = float(z)
        else:
            raise LedgerError(bad_value("event type", t, "unknown ledger event; the file is not a securefed ledger of this version"))

    # ------------------------------------------------------------------ queries

    def events(self, type: str | None = None) -> list[dict]:
        """All events in file order (optionally of one ``type``: ``"release"`` or ``"settle"``)."""
        return [dict(e) for e in self._events if type is None or e["type"] == type]

    def get(self, event_id: str) -> dict | None:
        """The event with this id, or ``None``."""
        e = self._by_id.get(event_id)
        return None if e is None else dict(e)

    def releases_at(self, site: int, round, step) -> list[dict]:
        """Release events of one coordinate (all attempts), oldest first."""
        return [dict(e) for e in self._by_coord.get((site, round, step), [])]

    def sites(self) -> list[int]:
        """Sites that have at least one release."""
        return sorted({e["site"] for e in self._events if e["type"] == "release"})

    def budget_for(self, site: int) -> float | None:
        """The ε budget that applies to ``site`` (the stricter of global and per-site)."""
        b = [v for v in (self.budget_epsilon, self.site_budgets.get(int(site))) if v is not None]
        return min(b) if b else None

    def history(self, site: int, *, max_round=None, extra=()) -> list[tuple[float, float, int]]:
        """Accountant history ``[(noise_multiplier, sample_rate, count)]`` of one site (settled values)."""
        c: Counter = Counter()
        for e in self._events:
            if e["type"] != "release" or e["site"] != site:
                continue
            if max_round is not None and (e["round"] is None or e["round"] > max_round):
                continue
            c[(self._z[e["id"]], float(e["sample_rate"]))] += 1
        for z, q in extra:
            c[(float(z), float(q))] += 1
        return sorted((z, q, n) for (z, q), n in c.items())

    def epsilon_of(self, history) -> float:
        """ε at the ledger's δ for a history, with the ledger's accountant."""
        return self.accountant.epsilon_history(history, self.delta)

    def spent(self, site: int | None = None) -> tuple[float, float]:
        """``(ε, δ)`` spent by ``site``, or globally (max over sites: disjoint records compose in parallel)."""
        if site is not None:
            return self.epsilon_of(self.history(int(site))), self.delta
        sites = self.sites()
        return (max((self.epsilon_of(self.history(p)) for p in sites), default=0.0), self.delta)

    def epsilon_by_round(self, site: int | None = None) -> list[tuple[int, float]]:
        """Cumulative ε after each round (global = max over sites), for the report plot."""
        rounds = sorted({e["round"] for e in self._events if e["type"] == "release" and e["round"] is not None})
        sites = [int(site)] if site is not None else self.sites()
        out = []
        for r in rounds:
            out.append((int(r), max((self.epsilon_of(self.history(p, max_round=r)) for p in sites), default=0.0)))
        return out

    # ------------------------------------------------------------------ budget checks

    def set_plan(self, site: int, noise_multiplier: float, sample_rate: float, count: int) -> float:
        """Register a site's planned releases and check that the whole plan fits its budget.

        Returns the plan's ε. Afterwards any pending history *dominated* by the plan (every noise
        multiplier ≥ the plan's, every rate ≤ the plan's, no more releases) is known to be within the
        plan's ε without recomputing it (ε is monotone in each of these), which keeps per-release
        checks cheap for the numerical accountants.
        """
        eps = self.epsilon_of([(float(noise_multiplier), float(sample_rate), int(count))])
        budget = self.budget_for(site)
        if budget is not None and eps > budget * (1 + _TOL) + 1e-12:
            raise BudgetExceededError(bad_value("privacy plan", f"site {site}: ε={eps:.4g} at δ={self.delta:g}",
                                                f"exceeds the budget ε={budget:g}; raise the noise multiplier, "
                                                "lower rounds/local steps or raise the budget"))
        self._plan[int(site)] = (float(noise_multiplier), float(sample_rate), int(count), eps)
        return eps

    def prospective_epsilon(self, site: int, noise_multiplier: float, sample_rate: float) -> tuple[float, bool]:
        """ε of ``site`` if one more release at ``(z, q)`` were made; second item: exact (False = plan bound)."""
        hist = self.history(site, extra=[(noise_multiplier, sample_rate)])
        plan = self._plan.get(int(site))
        if plan is not None:
            zp, qp, cp, ep = plan
            n = sum(c for _, _, c in hist)
            if n <= cp and all(z >= zp * (1 - 1e-12) and q <= qp for z, q, _ in hist):
                return ep, False
        return self.epsilon_of(hist), True

    def check(self, site: int, noise_multiplier: float, sample_rate: float = 1.0) -> float:
        """Raise :class:`BudgetExceededError` if one more release would exceed ``site``'s budget."""
        eps, _ = self.prospective_epsilon(site, noise_multiplier, sample_rate)
        self._refuse_over_budget(site, eps)
        return eps

    def _refuse_over_budget(self, site: int, eps: float) -> None:
        budget = self.budget_for(site)
        if budget is not None and eps > budget * (1 + _TOL) + 1e-12:
            raise BudgetExceededError(bad_value("release", f"site {site}: ε would reach {eps:.4g} at δ={self.delta:g}",
                                                f"exceeds the budget ε={budget:g}; nothing was sent — stop here, "
                                                "or start a new run with a larger budget or more noise"))

    # ------------------------------------------------------------------ writing

    def record_release(self, *, site: int, round, step, attempt: int, mechanism: str, sensitivity: float, sigma: float,
                       noise_multiplier: float, sample_rate: float = 1.0, **extra) -> dict:
        """Check the budget, then append and fsync one release event; returns it.

        Raises :class:`BudgetExceededError` (nothing written) when the release would exceed the budget,
        and :class:`LedgerError` when the id already exists (callers reuse existing events instead).
        """
        site = int(site)
        rid = release_id(self.run_id, site, round, step, attempt)
        if rid in self._by_id:
            raise LedgerError(bad_value("release id", rid, "is already in the ledger; reuse the existing event (idempotent redo)"))
        for name, v in (("sensitivity", sensitivity), ("sigma", sigma), ("noise_multiplier", noise_multiplier)):
            if not (isinstance(v, (int, float, np.floating)) and math.isfinite(float(v)) and float(v) > 0):
                raise ConfigError(bad_value(name, v, "must be a positive finite number"))
        eps_after, exact = self.prospective_epsilon(site, noise_multiplier, sample_rate)
        self._refuse_over_budget(site, eps_after)
        hist = self.history(site, extra=[(noise_multiplier, sample_rate)])
        ev = {
            "type": "release", "id": rid, "run_id": self.run_id, "site": site, "round": round, "step": step,
            "attempt": int(attempt), "mechanism": mechanism, "sensitivity": float(sensitivity), "sigma": float(sigma),
            "noise_multiplier": float(noise_multiplier), "sample_rate": float(sample_rate),
            "accountant_state": {"accountant": self.accountant_name, "delta": self.delta,
                                 "history": [list(h) for h in hist],
                                 ("epsilon_after" if exact else "epsilon_after_at_most"): eps_after},
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        }
        ev.update(extra)
        self._append(ev)
        return dict(ev)

    def record_settlement(self, *, round, step, survivors, releases: dict[str, float], attempt: int = 0) -> dict | None:
        """Append the actual noise multipliers of releases after a distributed-noise aggregation.

        Idempotent for an identical settlement. After writing, raises :class:`BudgetExceededError` if a
        site is now over budget (possible only if fewer sites survived than the worst case planned for);
        the run must stop — the figure is already in the ledger.
        """
        sid = f"{self.run_id}/settle/round{round}/step{step}/attempt{attempt}"
        old = self._by_id.get(sid)
        clean = {str(k): float(v) for k, v in releases.items()}
        if old is not None:
            if old["releases"] == clean:
                return None
            return self.record_settlement(round=round, step=step, survivors=survivors, releases=releases, attempt=attempt + 1)
        for rid in clean:
            if rid not in self._by_id:
                raise LedgerError(bad_value("settlement", rid, "names a release that is not in the ledger"))
        ev = {"type": "settle", "id": sid, "run_id": self.run_id, "round": round, "step": step,
              "survivors": [int(s) for s in survivors], "releases": clean,
              "time": _dt.datetime.now(_dt.timezone.utc).isoformat()}
        self._append(ev)
        for rid in clean:
            site = self._by_id[rid]["site"]
            budget = self.budget_for(site)
            if budget is not None:
                eps = self.epsilon_of(self.history(site))
                if eps > budget * (1 + _TOL) + 1e-12:
                    raise BudgetExceededError(bad_value("aggregation", f"round {round} step {step}: only {len(survivors)} sites survived",
                                                        f"site {site} has now spent ε={eps:.4g} > budget {budget:g}; the run stops. "
                                                        "Set min_survivors to the secure aggregator's threshold to prevent this"))
        return dict(ev)

    def summary(self) -> dict:
        """Small dict for reports: spent ε per site and global, δ, accountant, budget, recovery note."""
        per_site = {str(p): self.spent(p)[0] for p in self.sites()}
        return {"epsilon": max(per_site.values(), default=0.0), "delta": self.delta, "accountant": self.accountant_name,
                "budget_epsilon": self.budget_epsilon, "epsilon_per_site": per_site,
                "releases": sum(1 for e in self._events if e["type"] == "release"),
                "path": self.path, "recovered": self.recovered or None}
