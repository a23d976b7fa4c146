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
* **Validation.** Every line is checked on load: valid JSON, an object, a known ``type`` with every
  required field of the right type and a release id that matches its coordinates; anything else raises
  :class:`~securefed.errors.LedgerError` naming the line number and the fix. A duplicated event id (a
  line written twice) is refused — it would otherwise be counted twice.
* **Resume.** Reopening an existing ledger restores every site's spent budget. Before the first new
  release after reopening, :meth:`PrivacyLedger.check_plan` checks that what was spent **plus** what the
  remaining plan will still release fits the budget (``GradientPerturbation`` calls it on its first
  release); otherwise :class:`~securefed.errors.BudgetExceededError` is raised before anything is released.
* **Single writer.** A writer holds an exclusive, non-blocking OS lock (``fcntl.flock``) on the sidecar
  ``<path>.lock`` for the ledger's lifetime (released by :meth:`PrivacyLedger.close`, the context
  manager, or garbage collection). A second writer — another process, or a second ``PrivacyLedger`` on
  the same path in this process — gets :class:`~securefed.errors.LedgerError` naming the path and the
  holder's pid. Readers open with ``read_only=True`` (no lock, no writes, a torn last line handled in
  memory). A real deployment keeps one ledger per site plus the server's aggregate copy.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import math
import os
import time
from collections import Counter, defaultdict

import numpy as np

from ..errors import BudgetExceededError, ConfigError, LedgerError, bad_value
from .accountants import ACCOUNTANTS, check_delta, check_epsilon, get_accountant
from .events import ComposedEvent, ReleaseEvent, gaussian_release, history_of

__all__ = ["PrivacyLedger", "release_id", "array_digest", "memo_ledger"]

_VERSION = 1
_TOL = 1e-9


def _elsewhere_note(other: float, runs) -> str:
    if not other:
        return ""
    return f" + ε={other:.4g} this site spent in {len(runs)} other run(s) ({', '.join(runs)})"


def release_id(run_id: str, site: int, round, step, attempt: int) -> str:
    """Deterministic event id ``{run_id}/site{p}/round{s}/step{t}/attempt{a}``."""
    return f"{run_id}/site{site}/round{round}/step{step}/attempt{attempt}"


def array_digest(a: np.ndarray) -> str:
    """SHA-256 (first 32 hex digits) of an array's float64 bytes — identifies an exact redo."""
    b = np.ascontiguousarray(np.asarray(a, dtype=np.float64)).tobytes()
    return hashlib.sha256(b).hexdigest()[:32]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _is_coord(v) -> bool:
    return v is None or (_is_int(v) and v >= 0)


_RELEASE_FIELDS = {
    "id": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "site": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "round": (_is_coord, "null or a non-negative integer"),
    "step": (_is_coord, "null or a non-negative integer"),
    "attempt": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "mechanism": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "sensitivity": (lambda v: _is_num(v) and v > 0, "a positive finite number"),
    "sigma": (lambda v: _is_num(v) and v > 0, "a positive finite number"),
    "noise_multiplier": (lambda v: _is_num(v) and v > 0, "a positive finite number"),
    "sample_rate": (lambda v: _is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
}
_SETTLE_FIELDS = {
    "id": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "round": (_is_coord, "null or a non-negative integer"),
    "step": (_is_coord, "null or a non-negative integer"),
    "survivors": (lambda v: isinstance(v, list) and all(_is_int(k) and k >= 0 for k in v), "a list of site indices"),
    "releases": (
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_num(z) and z > 0 for k, z in v.items()),
        "an object {release id: positive noise multiplier}",
    ),
}
_FIX_LINE = (
    "restore the ledger from its backup (spent budget cannot be reconstructed from a damaged file); "
    "never edit a ledger by hand"
)


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
    read_only : bool
        Open an existing ledger to read it: no lock is taken, nothing is written (a torn last line is
        handled in memory only), and every write raises :class:`LedgerError`.

    Raises
    ------
    LedgerError
        another writer holds the ledger (names the path and its pid), or the file is malformed (names the
        line), or it belongs to another run / was started with another δ, accountant or budget.

    Notes
    -----
    Use it as a context manager, or call :meth:`close`, to release the writer's lock::

        with PrivacyLedger("ledger.jsonl", "run-1", budget_epsilon=1.0) as led:
            ...
    """

    def __init__(
        self,
        path,
        run_id: str,
        budget_epsilon=None,
        delta: float = 1e-5,
        accountant: str = "exact",
        site_budgets=None,
        *,
        read_only: bool = False,
        site_budget=None,
    ):
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
        self._release: dict[str, ReleaseEvent] = {}  # release id -> its event (as written)
        self._plan: dict[int, tuple[float, float, int, float]] = {}
        self.read_only = bool(read_only)
        #: the site-wide budget over all runs (:class:`~.site_budget.SiteBudget`), or None (this run only)
        self.site_budget = site_budget
        self._lock_fd: int | None = None
        if self.read_only and (self.path is None or not os.path.exists(self.path)):
            raise LedgerError(
                bad_value("path", self.path, "read_only=True opens an existing ledger file; it does not exist")
            )
        if self.path is not None and not self.read_only:
            self._acquire_lock()
        try:
            self._open_or_create(run_id, accountant)
        except BaseException:
            self.close()
            raise

    def _open_or_create(self, run_id: str, accountant: str) -> None:
        if self.path is not None and os.path.exists(self.path):
            self._load()
        else:
            self._header = {
                "type": "header",
                "v": _VERSION,
                "run_id": run_id,
                "delta": self.delta,
                "accountant": accountant,
                "budget_epsilon": self.budget_epsilon,
                "site_budgets": {str(k): v for k, v in self.site_budgets.items()},
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            }
            if self.site_budget is not None:
                self._header["site_index"] = os.path.basename(self.site_budget.index_path)
            if self.path is not None:
                self._create()

    # ------------------------------------------------------------------ the writer's lock

    @property
    def lock_path(self) -> str | None:
        """The sidecar lock file ``<path>.lock`` (``None`` for an in-memory ledger)."""
        return None if self.path is None else self.path + ".lock"

    def _acquire_lock(self) -> None:
        lp = self.lock_path
        try:
            fd = os.open(lp, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise LedgerError(
                bad_value(
                    "path",
                    self.path,
                    f"cannot open its lock file {lp} ({exc.strerror}); make the ledger directory writable",
                )
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            try:
                holder = ""
                for _ in range(40):  # the holder writes its pid just after taking the lock: give it a moment
                    holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                    if holder:
                        break
                    time.sleep(0.025)
                holder = holder or "unknown"
            finally:
                os.close(fd)
            raise LedgerError(
                bad_value(
                    "path",
                    self.path,
                    f"is held by another writer (pid {holder}, lock {lp}); one "
                    "writer per ledger — wait for that run to finish (or stop it), use another "
                    "ledger path, or open it with read_only=True to read it",
                )
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._lock_fd = fd

    def close(self) -> None:
        """Release the writer's lock (idempotent). The ledger stays readable in memory; writes raise."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
            self._closed = True

    @property
    def closed(self) -> bool:
        """True once a file-backed writer has released its lock (:meth:`close`)."""
        return bool(getattr(self, "_closed", False))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # best effort: a dropped writer releases its lock
        try:
            self.close()
        except Exception:
            pass

    def _check_writable(self) -> None:
        if self.read_only:
            raise LedgerError(
                bad_value("ledger", self.path, "was opened read_only=True; open it as the (single) writer to append")
            )
        if self.path is not None and self._lock_fd is None:
            raise LedgerError(
                bad_value("ledger", self.path, "is closed (its writer's lock was released); reopen it to append")
            )

    # ------------------------------------------------------------------ persistence

    def _create(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise LedgerError(
                bad_value("path", self.path, "was created concurrently; use one writer per ledger")
            ) from None
        try:
            os.write(fd, (json.dumps(self._header, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(self.path)

    def _append(self, event: dict) -> None:
        self._check_writable()
        self._validate(event, None)
        if event["id"] in self._by_id:
            raise LedgerError(
                bad_value(
                    "event id",
                    event["id"],
                    "is already in the ledger; an event is written once (reuse the existing one)",
                )
            )
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
            if self.site_budget is not None:
                self.site_budget.sync()  # the new line enters the site's hash-chained index
        self._ingest(event)

    def _load(self) -> None:
        with open(self.path, "rb") as fh:
            data = fh.read()
        if not data:
            raise LedgerError(
                bad_value("path", self.path, "is an empty file, not a ledger; remove it or use another path")
            )
        parsed, tail, repair = self._parse_lines(data)
        if not parsed or not isinstance(parsed[0][1], dict) or parsed[0][1].get("type") != "header":
            raise LedgerError(
                bad_value("path", self.path, "has no ledger header on line 1; it is not a securefed ledger")
            )
        self._adopt_header(parsed[0][1])
        first_line: dict[str, int] = {}
        for lineno, ev in parsed[1:]:
            self._validate(ev, lineno)
            if ev["id"] in first_line:
                raise LedgerError(
                    bad_value(
                        f"{self.path}:line {lineno}",
                        ev["id"],
                        f"duplicates the event id of line "
                        f"{first_line[ev['id']]}: a line written twice would be counted twice; "
                        f"{_FIX_LINE}",
                    )
                )
            first_line[ev["id"]] = lineno
            self._ingest(ev)
        if repair is not None and not self.read_only:  # only once the whole file has been validated
            self._repair_tail(repair, tail, len(data))

    def _parse_lines(self, data: bytes) -> tuple[list, bytes, str | None]:
        """The file's lines parsed as (line number, JSON), its unterminated last line, and the repair that line needs.

        A corrupt line before the last is an error; a torn last line is noted in ``self.recovered`` and either dropped
        (repair ``"drop"``: not valid JSON) or kept and counted (repair ``"newline"``: complete JSON, no newline)."""
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        parsed = []
        for i, raw in enumerate(lines):
            try:
                parsed.append((i + 1, json.loads(raw)))
            except (ValueError, UnicodeDecodeError):
                raise LedgerError(
                    bad_value(
                        f"{self.path}:line {i + 1}",
                        raw[:60],
                        f"corrupt ledger line (not the last one: not valid JSON); {_FIX_LINE}",
                    )
                ) from None
        repair = None
        if tail:
            try:
                ev = json.loads(tail)
            except (ValueError, UnicodeDecodeError):
                # torn during the write: the release had not been returned yet (write-ahead) -> drop it
                self.recovered = {"torn_last_line": "discarded", "bytes": len(tail)}
                repair = "drop"
            else:
                # complete JSON without its newline: it was written in full, so it may have been released — count it
                parsed.append((len(lines) + 1, ev))
                self.recovered = {"torn_last_line": "kept_and_counted"}
                repair = "newline"
        return parsed, tail, repair

    def _adopt_header(self, h: dict) -> None:
        """Check the header line ``h`` against this ledger's run id, version, delta and accountant, and take in the
        budgets the ledger was started with."""
        if h.get("run_id") != self.run_id:
            raise LedgerError(
                bad_value(
                    "run_id",
                    self.run_id,
                    f"the ledger at {self.path} belongs to run {h.get('run_id')!r}; "
                    "use that run id or another ledger path",
                )
            )
        if h.get("v") != _VERSION:
            raise LedgerError(bad_value("ledger version", h.get("v"), f"this securefed reads version {_VERSION}"))
        for key, mine in (("delta", self.delta), ("accountant", self.accountant_name)):
            if h.get(key) != mine:
                raise LedgerError(
                    bad_value(
                        key, mine, f"the ledger was started with {key}={h.get(key)!r}; resume with the same value"
                    )
                )
        hb = h.get("budget_epsilon")
        if hb is not None and not (_is_num(hb) and hb > 0):
            raise LedgerError(
                bad_value(f"{self.path}:line 1 budget_epsilon", hb, f"must be a positive number; {_FIX_LINE}")
            )
        if self.budget_epsilon is not None and hb is not None and not math.isclose(hb, self.budget_epsilon):
            raise LedgerError(
                bad_value(
                    "budget_epsilon",
                    self.budget_epsilon,
                    f"the ledger was started with budget {hb}; a budget cannot change mid-run",
                )
            )
        self.budget_epsilon = hb if hb is not None else self.budget_epsilon
        try:
            hs = {int(k): float(v) for k, v in (h.get("site_budgets") or {}).items()}
        except (TypeError, ValueError, AttributeError):
            raise LedgerError(
                bad_value(
                    f"{self.path}:line 1 site_budgets",
                    h.get("site_budgets"),
                    f"must be an object {{site: epsilon}}; {_FIX_LINE}",
                )
            ) from None
        self.site_budgets = {**hs, **self.site_budgets}
        self._header = h

    def _repair_tail(self, repair: str, tail: bytes, size: int) -> None:
        """Mend the torn last line ``tail`` of the file (``size`` bytes in all): move it to ``<path>.torn`` and cut it
        off (``"drop"``), or write the newline it lacks (``"newline"``)."""
        if repair == "drop":
            with open(self.path + ".torn", "ab") as fh:
                fh.write(tail + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            with open(self.path, "r+b") as fh:
                fh.truncate(size - len(tail))
                fh.flush()
                os.fsync(fh.fileno())
            self.recovered["moved_to"] = self.path + ".torn"
        else:
            with open(self.path, "ab") as fh:
                fh.write(b"\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _validate(self, ev, lineno: int | None) -> None:
        """Raise :class:`LedgerError` unless ``ev`` is a well-formed event of this ledger (``lineno`` for the message)."""
        where = f"{self.path}:line {lineno}" if lineno is not None else "event"
        if not isinstance(ev, dict):
            raise LedgerError(bad_value(where, ev, f"is valid JSON but not a ledger event (an object); {_FIX_LINE}"))
        t = ev.get("type")
        if t == "release":
            fields = _RELEASE_FIELDS
        elif t == "settle":
            fields = _SETTLE_FIELDS
        else:
            raise LedgerError(
                bad_value(
                    f"{where} type",
                    t,
                    "unknown ledger event type (expected 'release' or 'settle'; "
                    f"the header only on line 1); {_FIX_LINE}",
                )
            )
        for name, (ok, what) in fields.items():
            if name not in ev:
                raise LedgerError(
                    bad_value(f"{where} {name}", None, f"a {t} event needs the field {name!r} ({what}); {_FIX_LINE}")
                )
            if not ok(ev[name]):
                raise LedgerError(bad_value(f"{where} {name}", ev[name], f"must be {what}; {_FIX_LINE}"))
        if ev.get("run_id", self.run_id) != self.run_id:
            raise LedgerError(
                bad_value(
                    f"{where} run_id",
                    ev.get("run_id"),
                    f"this ledger is run {self.run_id!r}; an event of another run does not belong here; {_FIX_LINE}",
                )
            )
        if t == "release":
            want = release_id(self.run_id, ev["site"], ev["round"], ev["step"], ev["attempt"])
            if ev["id"] != want:
                raise LedgerError(
                    bad_value(
                        f"{where} id", ev["id"], f"does not match its coordinates (expected {want!r}); {_FIX_LINE}"
                    )
                )
            if "event" in ev:
                try:
                    e = ReleaseEvent.from_dict(ev["event"])
                except ConfigError as exc:
                    raise LedgerError(
                        bad_value(f"{where} event", ev["event"], f"is not a release event ({exc}); {_FIX_LINE}")
                    ) from None
                flat = (
                    ev["mechanism"],
                    float(ev["sensitivity"]),
                    float(ev["sigma"]),
                    float(ev["noise_multiplier"]),
                    float(ev["sample_rate"]),
                )
                if (
                    e.mechanism,
                    e.sensitivity,
                    e.noise.sigma,
                    e.noise_multiplier,
                    e.sample_rate,
                ) != flat or e.count != 1:
                    raise LedgerError(
                        bad_value(
                            f"{where} event",
                            ev["event"],
                            "disagrees with the line's mechanism, "
                            f"sensitivity, sigma, noise_multiplier or sample_rate; {_FIX_LINE}",
                        )
                    )
        else:
            for rid in ev["releases"]:
                if rid not in self._by_id or self._by_id[rid]["type"] != "release":
                    raise LedgerError(
                        bad_value(
                            f"{where} releases", rid, f"names a release that is not earlier in the ledger; {_FIX_LINE}"
                        )
                    )

    def _ingest(self, ev: dict) -> None:
        """Add a validated event to the in-memory indexes (callers validate and refuse duplicates first)."""
        t = ev.get("type")
        if t == "release":
            self._events.append(ev)
            self._by_id[ev["id"]] = ev
            self._by_coord[(ev["site"], ev["round"], ev["step"])].append(ev)
            self._release[ev["id"]] = self._event_of(ev)
            self._z[ev["id"]] = float(ev["noise_multiplier"])
        elif t == "settle":
            self._events.append(ev)
            self._by_id[ev["id"]] = ev
            for rid, z in ev["releases"].items():
                if rid in self._z:
                    self._z[rid] = float(z)
        else:
            raise LedgerError(
                bad_value("event type", t, "unknown ledger event; the file is not a securefed ledger of this version")
            )

    # ------------------------------------------------------------------ queries

    @staticmethod
    def _event_of(ev: dict) -> ReleaseEvent:
        """The release event of a validated line: its ``"event"``, or (older ledgers) built from its flat fields."""
        return ReleaseEvent.from_dict(ev["event"]) if "event" in ev else ReleaseEvent.from_ledger_fields(ev)

    def release_events(self, site: int) -> ComposedEvent:
        """Everything ``site`` released in this run, as one event tree (settled noise multipliers)."""
        return ComposedEvent(
            tuple(
                self._release[e["id"]].settled(self._z[e["id"]])
                for e in self._events
                if e["type"] == "release" and e["site"] == int(site)
            )
        )

    def check_event(self, site: int, event) -> float:
        """Refuse (:class:`BudgetExceededError`, before anything is released) when what ``site`` spent plus ``event``
        (e.g. all the releases a plan will still make, as one :class:`~.events.ComposedEvent`) would exceed its
        budget, over all its runs; returns that prospective ε of this run."""
        if not self.accountant.supports(event):
            self.accountant._refuse_unsupported(event)
        eps, _ = self._epsilon_with(int(site), history_of(event))
        with self._site_locked():
            other, runs = self._elsewhere()
        budget = self.budget_for(site)
        if budget is not None and eps + other > budget * (1 + _TOL) + 1e-12:
            n = sum(c for _, _, c in self.history(int(site)))
            raise BudgetExceededError(
                bad_value(
                    "planned releases",
                    f"site {site}: {n} release(s) already spent + the "
                    f"plan's reach ε={eps:.4g} at δ={self.delta:g}" + _elsewhere_note(other, runs),
                    f"exceeds the budget ε={budget:g}; nothing was released — start a new "
                    "run with a larger budget or more noise",
                )
            )
        return eps

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
        """Accountant history ``[(noise_multiplier, sample_rate, count)]`` of one site (settled values).

        ``extra``: hypothetical further releases, as ``(z, q)`` pairs (one release each) or ``(z, q, count)``.
        """
        c: Counter = Counter()
        for e in self._events:
            if e["type"] != "release" or e["site"] != site:
                continue
            if max_round is not None and (e["round"] is None or e["round"] > max_round):
                continue
            c[(self._z[e["id"]], self._release[e["id"]].sample_rate)] += 1
        for item in extra:
            z, q = item[0], item[1]
            c[(float(z), float(q))] += int(item[2]) if len(item) > 2 else 1
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
        rels = [e for e in self._events if e["type"] == "release"]
        rounds = sorted({e["round"] for e in rels if e["round"] is not None})
        sites = [int(site)] if site is not None else self.sites()
        # one pass per site: releases sorted by round, the history accumulated (same as history(p, max_round=r))
        per_site = {}
        for p in sites:
            mine = sorted(
                (e["round"], self._z[e["id"]], float(e["sample_rate"]))
                for e in rels
                if e["site"] == p and e["round"] is not None
            )
            c: Counter = Counter()
            eps_at, i = {}, 0
            for r in rounds:
                while i < len(mine) and mine[i][0] <= r:
                    c[(mine[i][1], mine[i][2])] += 1
                    i += 1
                eps_at[r] = self.epsilon_of(sorted((z, q, n) for (z, q), n in c.items())) if c else 0.0
            per_site[p] = eps_at
        return [(int(r), max((per_site[p][r] for p in sites), default=0.0)) for r in rounds]

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
        with self._site_locked():
            other, runs = self._elsewhere()
        if budget is not None and eps + other > budget * (1 + _TOL) + 1e-12:
            raise BudgetExceededError(
                bad_value(
                    "privacy plan",
                    f"site {site}: ε={eps:.4g} at δ={self.delta:g}" + _elsewhere_note(other, runs),
                    f"exceeds the budget ε={budget:g}; raise the noise multiplier, "
                    "lower rounds/local steps or raise the budget",
                )
            )
        self._plan[int(site)] = (float(noise_multiplier), float(sample_rate), int(count), eps)
        return eps

    def check_plan(self, site: int, noise_multiplier: float, sample_rate: float, count: int) -> float:
        """Refuse (before anything is released) when what ``site`` spent **plus** ``count`` more releases at
        ``(z, q)`` would exceed its budget; returns that prospective ε.

        Call it before the first new release after reopening a ledger, with ``count`` = the releases the
        remaining plan will still make (a crash mid-round followed by a resume redoes that round: with
        secret noise the redone releases are new and counted again, so a plan that fit at the start may
        no longer fit). :class:`~securefed.accounting.GradientPerturbation` calls it on its first release.

        Raises
        ------
        BudgetExceededError
            naming the site, the spent and the planned releases, the ε they would reach and the budget.
        ConfigError
            ``count`` is not a non-negative integer.
        """
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ConfigError(
                bad_value("count", count, "use the number of releases the remaining plan will make (≥ 0)")
            )
        site, count = int(site), int(count)
        spent_n = sum(c for _, _, c in self.history(site))
        eps, _ = self._epsilon_with(site, [(float(noise_multiplier), float(sample_rate), count)])
        budget = self.budget_for(site)
        with self._site_locked():
            other, runs = self._elsewhere()
        if budget is not None and eps + other > budget * (1 + _TOL) + 1e-12:
            raise BudgetExceededError(
                bad_value(
                    "remaining plan",
                    f"site {site}: {spent_n} release(s) already spent + {count} "
                    f"planned reach ε={eps:.4g} at δ={self.delta:g}" + _elsewhere_note(other, runs),
                    f"exceeds the budget ε={budget:g}; nothing was released — the run cannot "
                    "finish within its budget (a resumed run redoes releases that were already "
                    "sent). Start a new run with a larger budget or more noise",
                )
            )
        return eps

    def _epsilon_with(self, site: int, extra) -> tuple[float, bool]:
        """ε of ``site``'s history plus ``extra``; second item: exact (False = the registered plan's ε, which dominates)."""
        hist = self.history(site, extra=extra)
        plan = self._plan.get(int(site))
        if plan is not None:
            zp, qp, cp, ep = plan
            n = sum(c for _, _, c in hist)
            if n <= cp and all(z >= zp * (1 - 1e-12) and q <= qp for z, q, _ in hist):
                return ep, False
        return self.epsilon_of(hist), True

    def prospective_epsilon(self, site: int, noise_multiplier: float, sample_rate: float) -> tuple[float, bool]:
        """ε of ``site`` if one more release at ``(z, q)`` were made; second item: exact (False = plan bound)."""
        return self._epsilon_with(site, [(noise_multiplier, sample_rate)])

    def check(self, site: int, noise_multiplier: float, sample_rate: float = 1.0) -> float:
        """Raise :class:`BudgetExceededError` if one more release would exceed ``site``'s budget."""
        eps, _ = self.prospective_epsilon(site, noise_multiplier, sample_rate)
        with self._site_locked():
            self._refuse_over_budget(site, eps)
        return eps

    def _site_locked(self):
        """The site-wide lock, the index checked (:meth:`SiteBudget.sync`) — or nothing without a site budget."""
        if self.site_budget is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.site_budget.locked())
        try:
            self.site_budget.sync()
        except BaseException:
            stack.close()
            raise
        return stack

    def _elsewhere(self) -> tuple[float, list]:
        """ε this site spent in its other runs (0 without a site budget); under :meth:`_site_locked`."""
        if self.site_budget is None:
            return 0.0, []
        eps, _, runs = self.site_budget.spent_elsewhere(self.run_id)
        return eps, runs

    def _refuse_over_budget(self, site: int, eps: float) -> None:
        budget = self.budget_for(site)
        other, runs = self._elsewhere()
        if budget is not None and eps + other > budget * (1 + _TOL) + 1e-12:
            raise BudgetExceededError(
                bad_value(
                    "release",
                    f"site {site}: ε would reach {eps:.4g} at δ={self.delta:g}" + _elsewhere_note(other, runs),
                    f"exceeds the budget ε={budget:g}; nothing was sent — stop here, "
                    "or start a new run with a larger budget or more noise",
                )
            )

    # ------------------------------------------------------------------ writing

    def record_release(
        self,
        *,
        site: int,
        round,
        step,
        attempt: int,
        mechanism: str,
        sensitivity: float,
        sigma: float,
        noise_multiplier: float,
        sample_rate: float = 1.0,
        **extra,
    ) -> dict:
        """:meth:`record` of the release these flat fields describe (:func:`.events.gaussian_release`; the noise
        share, if any, from ``extra["noise_share"]``) — the form a site's reported line arrives in."""
        share = extra.get("noise_share")
        event = gaussian_release(
            mechanism,
            sigma=sigma,
            sensitivity=sensitivity,
            noise_multiplier=noise_multiplier,
            sample_rate=sample_rate,
            share=None if share is None else float(share),
        )
        return self.record(event, site=site, round=round, step=step, attempt=attempt, **extra)

    def record(self, event: ReleaseEvent, *, site: int, round, step, attempt: int, **extra) -> dict:
        """Check the budget, then append and fsync one release ``event`` (its :class:`~.events.ReleaseEvent` and its
        flat fields); returns the line as a dict.

        Raises :class:`ConfigError` when this ledger's accountant does not :meth:`~.accountants.Accountant.supports`
        the event or it is not one release, :class:`BudgetExceededError` (nothing written) when the release would
        exceed the budget, and :class:`LedgerError` when the id already exists (callers reuse existing events).
        """
        self._check_writable()
        if not isinstance(event, ReleaseEvent) or event.count != 1:
            raise ConfigError(bad_value("event", event, "record one release (a ReleaseEvent with count 1) per line"))
        if not self.accountant.supports(event):
            self.accountant._refuse_unsupported(event)
        site = int(site)
        round = None if round is None else int(round)
        step = None if step is None else int(step)
        rid = release_id(self.run_id, site, round, step, attempt)
        if rid in self._by_id:
            raise LedgerError(
                bad_value("release id", rid, "is already in the ledger; reuse the existing event (idempotent redo)")
            )
        z, q = event.noise_multiplier, event.sample_rate
        eps_after, exact = self.prospective_epsilon(site, z, q)
        with self._site_locked():  # checked and booked atomically against every run of this site
            self._refuse_over_budget(site, eps_after)
            hist = self.history(site, extra=[(z, q)])
            ev = {
                "type": "release",
                "id": rid,
                "run_id": self.run_id,
                "site": site,
                "round": round,
                "step": step,
                "attempt": int(attempt),
                "mechanism": event.mechanism,
                "sensitivity": event.sensitivity,
                "sigma": event.noise.sigma,
                "noise_multiplier": z,
                "sample_rate": q,
                "accountant_state": {
                    "accountant": self.accountant_name,
                    "delta": self.delta,
                    "history": [list(h) for h in hist],
                    ("epsilon_after" if exact else "epsilon_after_at_most"): eps_after,
                },
                "time": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            }
            ev.update(extra)
            ev["event"] = event.as_dict()
            self._append(ev)
            return dict(ev)

    def record_settlement(self, *, round, step, survivors, releases: dict[str, float], attempt: int = 0) -> dict | None:
        """Append the actual noise multipliers of releases after a distributed-noise aggregation.

        Idempotent for an identical settlement. After writing, raises :class:`BudgetExceededError` if a
        site is now over budget (possible only if fewer sites survived than the worst case planned for);
        the run must stop — the figure is already in the ledger.
        """
        self._check_writable()
        sid = f"{self.run_id}/settle/round{round}/step{step}/attempt{attempt}"
        old = self._by_id.get(sid)
        clean = {str(k): float(v) for k, v in releases.items()}
        if old is not None:
            if old["releases"] == clean:
                return None
            return self.record_settlement(
                round=round, step=step, survivors=survivors, releases=releases, attempt=attempt + 1
            )
        for rid in clean:
            if rid not in self._by_id:
                raise LedgerError(bad_value("settlement", rid, "names a release that is not in the ledger"))
        ev = {
            "type": "settle",
            "id": sid,
            "run_id": self.run_id,
            "round": round,
            "step": step,
            "survivors": [int(s) for s in survivors],
            "releases": clean,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        }
        with self._site_locked():
            self._append(ev)
        for rid in clean:
            site = self._by_id[rid]["site"]
            budget = self.budget_for(site)
            if budget is not None:
                eps = self.epsilon_of(self.history(site))
                if eps > budget * (1 + _TOL) + 1e-12:
                    raise BudgetExceededError(
                        bad_value(
                            "aggregation",
                            f"round {round} step {step}: only {len(survivors)} sites survived",
                            f"site {site} has now spent ε={eps:.4g} > budget {budget:g}; the run stops. "
                            "Set min_survivors to the secure aggregator's threshold to prevent this",
                        )
                    )
        return dict(ev)

    def summary(self) -> dict:
        """Small dict for reports: spent ε per site and global, δ, accountant, budget, recovery note."""
        per_site = {str(p): self.spent(p)[0] for p in self.sites()}
        seeded = sum(
            1 for e in self._events if e["type"] == "release" and e.get("noise_source") in ("seeded-testing", "seeded")
        )
        return {
            "epsilon": max(per_site.values(), default=0.0),
            "delta": self.delta,
            "accountant": self.accountant_name,
            "budget_epsilon": self.budget_epsilon,
            "epsilon_per_site": per_site,
            "releases": sum(1 for e in self._events if e["type"] == "release"),
            "seeded_testing_releases": seeded,
            "epsilon_void": seeded > 0,
            "path": self.path,
            "recovered": self.recovered or None,
        }


def memo_ledger(memo: dict, *args, **kw):
    """A :class:`PrivacyLedger` whose ε computations are memoised in ``memo`` (ε of an accountant history is a
    deterministic function of it). A site rebuilds its mechanism for every Flower message (fresh ClientApp
    process), and the numerical accountants (PRV, RDP) take seconds per ε; the memo lives in the site's
    own SuperNode state, so the site still computes every figure itself, once."""

    class _MemoLedger(PrivacyLedger):
        def epsilon_of(self, history) -> float:
            key = json.dumps([self.accountant_name, self.delta, [[float(z), float(q), int(n)] for z, q, n in history]])
            if key not in memo:
                memo[key] = float(PrivacyLedger.epsilon_of(self, history))
            return memo[key]

    return _MemoLedger(*args, **kw)
