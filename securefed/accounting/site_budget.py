"""One site's privacy budget over all its runs: one folder of run ledgers, one lock, one hash-chained index.

A site keeps one write-ahead ledger per run (``<ledger-path>/<run-id>.jsonl``, :class:`~.ledger.PrivacyLedger`) and
one budget, ``epsilon-budget``, for everything it ever releases. :class:`SiteBudget` makes that budget hold whatever
the run ids and whatever happens to the files:

* **One lock.** Every check and every booking of a release, of any run, happens while the site holds an exclusive
  OS lock (``fcntl.flock``) on ``<ledger-path>/site.lock`` (:meth:`SiteBudget.locked`). Two runs interleaved at one
  site (a release of run A, both of run B, the second of run A) are checked in turn against everything booked
  before, never against a figure read when a run started.
* **Everything the site spent.** The check of a release adds what every other run's ledger holds
  (:meth:`SiteBudget.spent_elsewhere`) to what this run will hold with the release. Runs compose by basic
  composition — ``(Σ ε_r, Σ δ_r)``, each run's ε at its own δ with its own accountant — a valid bound whatever
  the runs' accountants, sampling rates or mechanisms.
* **Tamper evidence.** ``<ledger-path>/site-index.jsonl`` is append-only: one line per line of every run ledger
  (file name, line number, SHA-256 of the line), each chained to the previous one by a SHA-256 over both
  (:func:`chain_hash`). At every open and every booking (:meth:`SiteBudget.sync`) the chain is checked and every
  indexed line is compared with its ledger: a ledger that is missing (deleted or renamed), emptied, truncated or
  altered in any line — its header too — raises :class:`~securefed.errors.LedgerError` naming the file and the
  line. The budget is never granted again on a ledger the site cannot read back. Lines a ledger holds beyond
  its index (a crash between the ledger's fsync and the index's) and ledger files the index does not name yet
  are validated (a malformed one is refused, naming it) and indexed: they can only add spending.
* **Old folders.** A folder written before the index existed (no ``site-index.jsonl``) is read as before: its
  ledgers are validated and indexed on first use. A ledger created under an index names it in its header
  (``"site_index"``); if the index is then missing, the site refuses (an index deleted with a ledger would
  otherwise forget that ledger).

Cost: each :class:`SiteBudget` object (a site builds one per message) verifies the whole folder at its first sync and
again whenever a file's size, modification time or inode changed (``BENCHMARKS.md``: about 1.7× the wall time of
a 40-release run on a shared VM); an edit that restores all three within one message is seen at the next message.

What the index cannot see: the index and a ledger deleted together with every header that named the index, or the
whole folder replaced by an older copy (a backup restored over newer spending). Keep the folder on storage whose
history the operator controls; the coordinator's aggregate ledger of each run is an independent copy to compare.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time

from ..errors import LedgerError, bad_value

__all__ = ["SiteBudget", "chain_hash", "INDEX_NAME", "LOCK_NAME"]

INDEX_NAME = "site-index.jsonl"
LOCK_NAME = "site.lock"
_GENESIS = "0" * 64
_LOCK_WAIT = 60.0  # seconds a booking waits for another run of this site to finish its own
_FIX = (
    "restore the folder from its backup; a site never grants its budget again on a ledger it cannot read back "
    "(never edit, rename or delete a ledger by hand)"
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chain_hash(prev: str, file: str, line: int, digest: str) -> str:
    """The index's chain value after one entry: ``SHA-256(prev ‖ file ‖ line ‖ digest)``."""
    return _sha(f"{prev}\n{file}\n{int(line)}\n{digest}".encode())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _complete_lines(path: str) -> list[bytes]:
    """The newline-terminated lines of a file (a torn last line is left to the ledger's own recovery)."""
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    lines.pop()  # b"" after the last newline, or a torn fragment
    return lines


class SiteBudget:
    """The site-wide budget of one ``ledger-path`` folder (module docstring).

    Parameters
    ----------
    directory : str
        The site's ledger folder (created if missing).
    budget_epsilon : float
        The site's ``epsilon-budget``: the total ε over all its runs.
    open_ledger : callable
        ``open_ledger(path, header) -> PrivacyLedger`` opening a run ledger read-only (the caller's memoised
        accountant); used to read what other runs spent.
    spent_cache : dict, optional
        ``{file: [hash of its last line, ε, δ]}`` kept by the caller between messages (a site rebuilds this object
        for every message): a run ledger is read again only when it has changed.
    """

    def __init__(self, directory: str, budget_epsilon: float, open_ledger, spent_cache: dict | None = None):
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.budget_epsilon = float(budget_epsilon)
        self.index_path = os.path.join(self.directory, INDEX_NAME)
        self.lock_path = os.path.join(self.directory, LOCK_NAME)
        self._open_ledger = open_ledger
        self._fd: int | None = None
        self._depth = 0
        self._spent: dict = {} if spent_cache is None else spent_cache  # file -> [last line hash, ε, δ]
        self._files: dict[str, list[str]] = {}  # file -> hashes of its indexed lines (after sync)
        self._synced: tuple | None = None  # the folder's stamp after the last full sync

    # ------------------------------------------------------------------ the lock

    @contextlib.contextmanager
    def locked(self):
        """Hold the site's lock (re-entrant within this object); waits up to a minute for another run's booking."""
        if self._depth == 0:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            t0 = time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except (BlockingIOError, PermissionError):
                    if time.monotonic() - t0 > _LOCK_WAIT:
                        os.close(fd)
                        raise LedgerError(
                            bad_value(
                                "ledger-path",
                                self.directory,
                                f"its site lock {self.lock_path} has "
                                f"been held for over {_LOCK_WAIT:g} s by another process; stop the "
                                "stuck run of this site, then retry",
                            )
                        ) from None
                    time.sleep(0.01)
            self._fd = fd
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            if self._depth == 0 and self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    os.close(fd)

    def _need_lock(self) -> None:
        if self._depth == 0:
            raise LedgerError(
                bad_value("site budget", self.directory, "is read or booked only under its lock (SiteBudget.locked())")
            )

    # ------------------------------------------------------------------ the index

    def _ledger_files(self) -> list[str]:
        return sorted(
            f
            for f in os.listdir(self.directory)
            if f.endswith(".jsonl") and f != INDEX_NAME and os.path.isfile(os.path.join(self.directory, f))
        )

    def _read_index(self) -> tuple[list[dict], str]:
        if not os.path.exists(self.index_path):
            return [], _GENESIS
        entries, prev = [], _GENESIS
        for k, raw in enumerate(_complete_lines(self.index_path), start=1):
            where = f"{self.index_path}:line {k}"
            try:
                e = json.loads(raw)
                ok = (
                    isinstance(e, dict)
                    and isinstance(e.get("file"), str)
                    and isinstance(e.get("line"), int)
                    and isinstance(e.get("sha256"), str)
                    and isinstance(e.get("chain"), str)
                )
            except (ValueError, UnicodeDecodeError):
                ok = False
            if not ok:
                raise LedgerError(bad_value(where, raw[:60], f"is not an index entry; {_FIX}"))
            if e["chain"] != chain_hash(prev, e["file"], e["line"], e["sha256"]):
                raise LedgerError(
                    bad_value(
                        where,
                        e["chain"][:16],
                        f"breaks the index's hash chain (an entry was altered, removed or inserted); {_FIX}",
                    )
                )
            prev = e["chain"]
            entries.append(e)
        return entries, prev

    def sync(self) -> None:
        """Check the index and every ledger against it, then index what is new (module docstring); under the lock.

        Raises
        ------
        LedgerError
            naming the file (and line) of a ledger that is missing, renamed, emptied, truncated or altered, of a
            malformed ledger the index does not name yet, or of a missing index that a ledger names.
        """
        self._need_lock()
        stamp = self._stamp()
        if stamp == self._synced:
            return  # nothing changed since this object verified the folder (a new object, e.g. per message, verifies)
        entries, prev = self._read_index()
        indexed: dict[str, list[str]] = {}
        for e in entries:
            indexed.setdefault(e["file"], []).append(e["sha256"])
            if len(indexed[e["file"]]) != e["line"]:
                raise LedgerError(
                    bad_value(f"{self.index_path} entry for {e['file']}", e["line"], f"is out of order; {_FIX}")
                )
        present = self._ledger_files()
        if not os.path.exists(self.index_path):
            for f in present:
                self._refuse_orphan_of_missing_index(f)
            fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the index exists from now on
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.directory)
        new: list[tuple[str, int, str]] = []
        for f, hashes in indexed.items():
            path = os.path.join(self.directory, f)
            if not os.path.exists(path):
                raise LedgerError(
                    bad_value(
                        "ledger",
                        path,
                        f"is missing (deleted or renamed): the site's index "
                        f"{self.index_path} records {len(hashes)} line(s) of it; {_FIX}",
                    )
                )
            lines = _complete_lines(path)
            if len(lines) < len(hashes):
                what = "is empty" if not lines else f"holds {len(lines)} line(s)"
                raise LedgerError(
                    bad_value(
                        "ledger",
                        path,
                        f"{what} but the site's index recorded {len(hashes)} (emptied or truncated); {_FIX}",
                    )
                )
            for k, (raw, h) in enumerate(zip(lines, hashes), start=1):
                if _sha(raw) != h:
                    raise LedgerError(
                        bad_value(
                            "ledger", path, f"line {k} differs from what the site's index recorded (altered); {_FIX}"
                        )
                    )
            if len(lines) > len(hashes):
                self._check_lines(path, lines, len(hashes))
                new += [(f, k, _sha(raw)) for k, raw in enumerate(lines[len(hashes) :], start=len(hashes) + 1)]
            self._files[f] = hashes + [h for g, _, h in new if g == f]
        for f in present:
            if f in indexed:
                continue
            path = os.path.join(self.directory, f)
            self._validate(path)
            lines = _complete_lines(path)
            new += [(f, k, _sha(raw)) for k, raw in enumerate(lines, start=1)]
            self._files[f] = [_sha(raw) for raw in lines]
        if new:
            out = []
            for f, k, h in new:
                prev = chain_hash(prev, f, k, h)
                out.append(json.dumps({"file": f, "line": k, "sha256": h, "chain": prev}, sort_keys=True) + "\n")
            fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, "".join(out).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        self._synced = self._stamp()

    def _stamp(self) -> tuple:
        """Size, modification time and inode of the index and every ledger: what :meth:`sync` last verified."""
        out = []
        for f in [INDEX_NAME] + self._ledger_files():
            try:
                st = os.stat(os.path.join(self.directory, f))
            except FileNotFoundError:
                continue
            out.append((f, st.st_size, st.st_mtime_ns, st.st_ino))
        return tuple(out)

    def _header(self, path: str) -> dict:
        try:
            with open(path, "rb") as fh:
                head = json.loads(fh.readline())
        except (ValueError, UnicodeDecodeError):
            head = None
        if not isinstance(head, dict) or head.get("type") != "header" or not isinstance(head.get("run_id"), str):
            raise LedgerError(
                bad_value(
                    "ledger", path, f"has no ledger header on line 1 (not a securefed ledger, or damaged); {_FIX}"
                )
            )
        return head

    def _check_lines(self, path: str, lines: list, start: int) -> None:
        """New lines of an indexed ledger (its writer's appends, validated before they were written): each must be a
        JSON object with a ledger event type; the writer's own load validates them in full."""
        for k, raw in enumerate(lines[start:], start=start + 1):
            try:
                ev = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                ev = None
            if not isinstance(ev, dict) or ev.get("type") not in ("release", "settle"):
                raise LedgerError(bad_value("ledger", path, f"line {k} is not a ledger event; {_FIX}"))

    def _validate(self, path: str) -> None:
        """Load a ledger read-only: every line validated by :class:`PrivacyLedger` (LedgerError naming the file)."""
        head = self._header(path)
        try:
            self._open_ledger(path, head)
        except LedgerError as exc:
            raise LedgerError(f"{path}: {exc}") from None

    def _refuse_orphan_of_missing_index(self, f: str) -> None:
        path = os.path.join(self.directory, f)
        try:
            head = self._header(path)
        except LedgerError:
            return  # _validate names it
        if head.get("site_index"):
            raise LedgerError(
                bad_value(
                    "site index",
                    self.index_path,
                    f"is missing, but the ledger {path} was written "
                    f"under it; a deleted index could hide a deleted ledger; {_FIX}",
                )
            )

    # ------------------------------------------------------------------ spending

    def spent_elsewhere(self, run_id: str) -> tuple[float, float, list[str]]:
        """``(ε, δ, runs)`` this site spent in runs other than ``run_id`` (basic composition over runs), from the
        ledgers as :meth:`sync` last verified them; under the lock."""
        self._need_lock()
        eps, delta, runs = 0.0, 0.0, []
        for f in sorted(self._files):
            if f == f"{run_id}.jsonl" or not self._files[f]:
                continue
            key = self._files[f][-1]
            got = self._spent.get(f)
            if got is None or got[0] != key:
                path = os.path.join(self.directory, f)
                head = self._header(path)
                led = self._open_ledger(path, head)
                got = [key, float(led.spent()[0]), float(head["delta"])]
                self._spent[f] = got
            if got[1] > 0:
                eps, delta = eps + got[1], delta + got[2]
                runs.append(f[: -len(".jsonl")])
        return eps, delta, runs
