"""SecAgg+ neighbour graphs and the choice of degree k and threshold t from a stated threat model.

Bell, Bonawitz, Gascón, Lepoint, Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020 (SecAgg+): clients share their secrets only with their neighbours in a random
k-regular **Harary graph** H(n, k) — the ring where each node is joined to its ⌊k/2⌋ nearest nodes on each
side (plus the antipodal node when k is odd) — under a random relabelling drawn from a **public** seed.
With k = n − 1 the graph is complete and the protocol is classic SecAgg (Bonawitz et al. 2017).

Parameters are chosen so that, for ``n`` clients of which a fraction γ is corrupt (colluding with the
server) and each drops out independently with probability δ, three failure events are each bounded
(union bound over the n clients) — these are the conditions of Bell et al. 2020, §3.2 / Lemma 3.5,
evaluated exactly with hypergeometric / binomial tails rather than asymptotic Chernoff bounds:

1. **Privacy of the shares** (:func:`share_leak_probability`). Actively malicious server
   (``server_model="malicious"``, the default): an honest client releases one kind of share per peer, so
   with c_v colluders among v's k neighbours the server can combine at most c_v + (k − c_v)/2 shares of a
   kind; require **2t > k + c_v** (docs/threat-model-secure-sum.md (S)), i.e. ``n · P[Hyp(n−1, c, k) ≥ 2t − k] ≤ 2^−σ`` — exactly
   0 for the complete graph when 2t > k + c. Honest-but-curious server (``"semi-honest"``, explicit
   opt-in): leak only if t of the k neighbours are corrupt, ``n · P[Hyp(n−1, c, k) ≥ t] ≤ 2^−σ``.
2. **Connectivity** (:func:`disconnect_probability`): the graph left after removing corrupt and dropped
   nodes must stay connected, or the server learns partial sums. H(n, k) under a random labelling
   disconnects only if ⌊k/2⌋ ring-consecutive nodes are all removed:
   ``n · P[⌊k/2⌋ given nodes all removed] ≤ 2^−σ`` with removal probability γ + δ − γδ. Against a malicious
   server the sites also bound a cut next to one honest survivor (:func:`cut_probability`, (C)).
3. **Correctness** (:func:`dropout_failure_probability`): every client keeps ≥ t live neighbours,
   ``n · P[Bin(k, δ) > k − t] ≤ 2^−η``.

**Global quorum** (:func:`default_quorum`): every revealer requires q valid consistency signatures from
distinct members of the *same* survivor set, with **2q > n + c**; honest sites sign one set per round, so two
different sets would need 2(q − c) ≤ n − c honest signers — impossible: the server cannot show two groups
two survivor sets and unmask anyone by equivocation (Bonawitz et al. 2017, active variant; docs/threat-model-secure-sum.md (Q)).

Malicious model (default): for ``n ≤ complete_up_to`` (128) the graph is complete (classic SecAgg; no
disconnection, no cut) with the smallest safe threshold ``t = ⌊(n − 1 + c)/2⌋ + 1`` — the most dropouts
tolerated — and ``q = ⌊(n + c)/2⌋ + 1``, where c (colluding sites) defaults to ``⌈γ n⌉`` and at least 1.
Too few sites for any safe choice (t > n − 1, t < 2 or q > n) is a :class:`ConfigError`, never a silently
weaker round. Above ``complete_up_to`` the smallest k meeting all three bounds is returned, with the *largest* t
that still meets the correctness bound. :func:`check_parameters` is the sites' side of the same rule.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..errors import ConfigError, bad_value

__all__ = [
    "GraphParams",
    "harary_graph",
    "choose_parameters",
    "share_leak_probability",
    "disconnect_probability",
    "dropout_failure_probability",
    "cut_probability",
    "default_colluders",
    "default_quorum",
    "check_parameters",
    "COMPLETE_UP_TO",
]

#: Up to this many clients the default graph (and the sites' degree floor) is the complete graph.
COMPLETE_UP_TO = 128


@dataclass(frozen=True)
class GraphParams:
    """Degree, threshold and the failure bounds they achieve (log2 probabilities, -inf when exactly 0)."""

    n: int
    degree: int
    threshold: int
    log2_leak: float
    log2_disconnect: float
    log2_dropout_failure: float
    source: str
    quorum: int = 0
    colluders: int = 0
    server_model: str = "malicious"

    @property
    def dropouts_tolerated(self) -> int:
        """Clients that may drop (anywhere in the round) while it still completes: every survivor keeps
        ≥ t of its k neighbours (complete graph: n − 1 − t) and the quorum is met (n − q)."""
        return max(0, min(self.degree - self.threshold, self.n - (self.quorum or self.n // 2 + 1)))

    def as_dict(self) -> dict:
        def fin(v):  # JSON has no -inf: None means "probability exactly 0"
            return None if v == -math.inf else round(v, 3)

        return dict(
            n=self.n,
            degree=self.degree,
            threshold=self.threshold,
            quorum=self.quorum,
            colluders=self.colluders,
            server_model=self.server_model,
            log2_leak=fin(self.log2_leak),
            log2_disconnect=fin(self.log2_disconnect),
            log2_dropout_failure=fin(self.log2_dropout_failure),
            dropouts_tolerated=self.dropouts_tolerated,
            source=self.source,
        )


def _log2(p: float) -> float:
    return -math.inf if p <= 0 else math.log2(p)


def default_colluders(n: int, corrupt_fraction: float = 0.1) -> int:
    """The default number c of sites colluding with the server: ``⌈γ n⌉``, at least 1."""
    return max(1, int(math.ceil(corrupt_fraction * n - 1e-9)))


def default_quorum(n: int, colluders: int) -> int:
    """Smallest q with 2q > n + c: two survivor sets can never both gather q signatures (docs/threat-model-secure-sum.md (Q))."""
    return (n + colluders) // 2 + 1


def share_leak_probability(
    n: int, k: int, t: int, corrupt_fraction: float, server_model: str = "semi-honest", colluders: int | None = None
) -> float:
    """Bell et al. 2020, Lemma 3.5 (privacy): ``n · P[Hyp(n−1, c, k) ≥ need]`` (capped at 1).

    ``need = t`` for an honest-but-curious server, ``2t − k`` for a malicious one; c is ``colluders`` or
    ``⌈γ n⌉``. With k = n − 1 the hypergeometric is the constant c, so the bound is exactly 0 or 1.
    """
    corrupt = int(colluders) if colluders is not None else int(math.ceil(corrupt_fraction * n - 1e-9))
    need = t if server_model == "semi-honest" else 2 * t - k
    if need <= 0:
        return 1.0
    p = float(stats.hypergeom.sf(need - 1, n - 1, min(corrupt, n - 1), k))
    return min(1.0, n * p)


def disconnect_probability(n: int, k: int, corrupt_fraction: float, dropout_rate: float) -> float:
    """Bell et al. 2020, Lemma 3.5 (connectivity) for H(n, k): ``n · (γ + δ − γδ)^⌊k/2⌋`` (capped at 1).

    Complete graphs (k = n − 1) cannot be split by removals, so the bound is 0 there.
    """
    if k >= n - 1:
        return 0.0
    removed = corrupt_fraction + dropout_rate - corrupt_fraction * dropout_rate
    return min(1.0, n * removed ** max(1, k // 2))


def cut_probability(n: int, k: int, t: int, colluders: int) -> float:
    """(C) A cut of the honest survivors' masking graph next to one honest survivor b (the server would learn a
    partial sum): b keeps t partners in U while the ⌊k/2⌋-window on one ring side holds no honest survivor,
    so that window holds ≥ t − ⌈k/2⌉ colluders: ``n · P[Hyp(n, c, ⌊k/2⌋) ≥ t − ⌈k/2⌉]`` (0 for k = n − 1,
    where 2t > k + c already connects the honest survivors; docs/threat-model-secure-sum.md (C))."""
    if k >= n - 1:
        return 0.0
    need = t - (k + 1) // 2
    if need <= 0:
        return 1.0
    p = float(stats.hypergeom.sf(need - 1, n, min(int(colluders), n), k // 2))
    return min(1.0, n * p)


def check_parameters(
    n: int,
    k: int,
    t: int,
    q: int,
    colluders: int,
    *,
    security_bits: float = 40.0,
    complete_up_to: int = COMPLETE_UP_TO,
    min_threshold: int = 2,
) -> list[str]:
    """What is unsafe about (n, k, t, q) against a malicious server with ``colluders`` colluding sites.

    Returns a list of violations (empty: safe), each naming the rule and its fix: t ≥ ``min_threshold``;
    the complete graph up to ``complete_up_to`` sites; the share condition 2t > k + c (leak bound
    ≤ 2^−σ for sparse graphs); the cut bound (C); the global quorum 2q > n + c (docs/threat-model-secure-sum.md).
    """
    c = int(colluders)
    out = []
    if t < min_threshold:
        out.append(f"threshold t = {t} is below the floor {min_threshold} (secagg-min-threshold)")
    if n <= complete_up_to and k != n - 1:
        out.append(
            f"degree k = {k} for n = {n} sites: up to secagg-complete-up-to = {complete_up_to} sites the "
            f"graph must be complete (k = {n - 1})"
        )
    sec = 2.0**-security_bits
    if k >= n - 1:
        if not 2 * t > k + min(c, k):
            out.append(
                f"threshold t = {t} with k = {k} neighbours and c = {c} colluders: 2t > k + c fails, so an "
                f"equivocating server could collect both shares of a site (use t >= {(k + min(c, k)) // 2 + 1})"
            )
    else:
        leak = share_leak_probability(n, k, t, 0.0, "malicious", colluders=c)
        if leak > sec:
            out.append(
                f"threshold t = {t} with k = {k}: probability 2^{_log2(leak):.1f} that some site has "
                f">= 2t - k colluding neighbours (need <= 2^-{security_bits:g}); raise t or the degree"
            )
        cut = cut_probability(n, k, t, c)
        if cut > sec:
            out.append(
                f"degree k = {k}, t = {t}: probability 2^{_log2(cut):.1f} of a cut next to an honest "
                f"survivor (partial sums; need <= 2^-{security_bits:g}); raise the degree"
            )
    if not 2 * q > n + c:
        out.append(
            f"quorum q = {q} of n = {n} sites with c = {c} colluders: 2q > n + c fails, so two survivor "
            f"sets could both be confirmed (use q >= {default_quorum(n, c)})"
        )
    if q > n:
        out.append(f"quorum q = {q} exceeds the {n} sites")
    return out


def dropout_failure_probability(n: int, k: int, t: int, dropout_rate: float) -> float:
    """Correctness: ``n · P[Bin(k, δ) > k − t]`` — some client keeps fewer than t live neighbours."""
    p = float(stats.binom.sf(k - t, k, dropout_rate))
    return min(1.0, n * p)


def _checked_choice(
    n: int,
    degree: int | None,
    dropout_rate: float,
    corrupt_fraction: float,
    server_model: str,
    colluders: int | None,
    quorum: int | None,
) -> tuple[int, int]:
    """The arguments of :func:`choose_parameters`, checked; returns the colluders bound c and the quorum q (their
    defaults when not given)."""
    if server_model not in ("semi-honest", "malicious"):
        raise ConfigError(bad_value("server_model", server_model, 'use "semi-honest" or "malicious"'))
    if not isinstance(n, (int, np.integer)) or n < 2:
        raise ConfigError(bad_value("clients", n, "secure aggregation needs at least 2 clients"))
    for name, v in (("dropout_rate", dropout_rate), ("corrupt_fraction", corrupt_fraction)):
        if not 0.0 <= v < 1.0:
            raise ConfigError(bad_value(name, v, "use a fraction in [0, 1)"))
    if degree is not None and not 1 <= degree <= n - 1:
        raise ConfigError(bad_value("degree", degree, f"use 1 <= degree <= clients-1 = {n - 1}"))
    if degree is not None and degree % 2 == 1 and n % 2 == 1 and degree != n - 1:
        raise ConfigError(
            bad_value("degree", degree, "an odd degree needs an even number of clients; use an even degree")
        )
    c = default_colluders(n, corrupt_fraction) if colluders is None else int(colluders)
    if not 0 <= c < n:
        raise ConfigError(bad_value("colluders", colluders, f"use 0 <= colluders < clients = {n}"))
    q = default_quorum(n, c) if quorum is None else int(quorum)
    if not 1 <= q <= n:
        raise ConfigError(bad_value("quorum", quorum, f"use 1 <= quorum <= clients = {n}"))
    return c, q


def _search_threat_model(
    n: int,
    degree: int | None,
    params,
    *,
    dropout_rate: float,
    corrupt_fraction: float,
    security_bits: float,
    correctness_bits: float,
    server_model: str,
    c: int,
) -> GraphParams:
    """The smallest degree k (``degree`` only, when given) with a threshold t meeting the bounds, and the largest
    such t (``params(k, t, source)`` builds the result); raises :class:`ConfigError` when none does."""
    sec, cor = 2.0**-security_bits, 2.0**-correctness_bits
    candidates = [degree] if degree is not None else [k for k in range(2, n) if k % 2 == 0 or n % 2 == 0] + [n - 1]
    seen = set()
    failures = []
    for k in candidates:
        if k in seen or k < 1:
            continue
        seen.add(k)
        dis = disconnect_probability(n, k, corrupt_fraction, dropout_rate)
        if dis > sec:
            failures.append(f"k={k}: disconnection 2^{_log2(dis):.1f}")
            continue
        best = None
        for t in range(1, k + 1):
            leak = share_leak_probability(n, k, t, corrupt_fraction, server_model, c)
            if leak > sec or (server_model == "malicious" and (t < 2 or cut_probability(n, k, t, c) > sec)):
                continue
            drop = dropout_failure_probability(n, k, t, dropout_rate)
            if drop > cor:
                break  # larger t only makes dropout failures likelier
            best = params(k, t, "threat-model")
        if best is not None:
            return best
        failures.append(
            f"k={k}: no t has share leak <= 2^-{security_bits:g} and dropout failure <= 2^-{correctness_bits:g}"
        )
    raise ConfigError(
        bad_value(
            "threat model",
            dict(
                clients=n,
                dropout_rate=dropout_rate,
                corrupt_fraction=corrupt_fraction,
                security_bits=security_bits,
                correctness_bits=correctness_bits,
            ),
            "no degree/threshold meets these bounds (" + "; ".join(failures[-3:]) + "); lower the dropout rate or the "
            "corrupt fraction, relax security_bits/correctness_bits, or give degree and threshold explicitly",
        )
    )


def choose_parameters(
    n: int,
    *,
    degree: int | None = None,
    threshold: int | None = None,
    dropout_rate: float = 0.1,
    corrupt_fraction: float = 0.1,
    security_bits: float = 40.0,
    correctness_bits: float = 10.0,
    server_model: str = "malicious",
    colluders: int | None = None,
    quorum: int | None = None,
    complete_up_to: int = COMPLETE_UP_TO,
) -> GraphParams:
    """Pick (k, t, q) for ``n`` clients from the threat model, or check explicitly given ones.

    Parameters
    ----------
    n : int
        Number of clients starting the round.
    degree, threshold : int, optional
        Explicit k and t. When both are given they are used as-is (bounds are still reported). When
        only ``degree`` is given the smallest t meeting the bounds for that k is chosen.
    dropout_rate : float
        δ, probability that a client drops during the round.
    corrupt_fraction : float
        γ, fraction of clients that may collude with the server.
    security_bits : float
        σ: leak and disconnection probabilities are each ≤ 2^−σ.
    correctness_bits : float
        η: probability that the round fails because of dropouts is ≤ 2^−η.
    server_model : {"malicious", "semi-honest"}
        Which privacy condition to enforce (see the module docstring); "semi-honest" only on request.
    colluders : int, optional
        c, the sites that may collude with the server (default ``⌈γ n⌉``, at least 1).
    quorum : int, optional
        q, consistency signatures every revealer requires (default ``⌊(n + c)/2⌋ + 1``).
    complete_up_to : int
        Malicious model: the complete graph for up to this many clients.
    """
    c, q = _checked_choice(n, degree, dropout_rate, corrupt_fraction, server_model, colluders, quorum)

    def params(k, t, source):
        return GraphParams(
            n,
            k,
            t,
            _log2(share_leak_probability(n, k, t, corrupt_fraction, server_model, c)),
            _log2(disconnect_probability(n, k, corrupt_fraction, dropout_rate)),
            _log2(dropout_failure_probability(n, k, t, dropout_rate)),
            source,
            q,
            c,
            server_model,
        )

    if threshold is not None and degree is None:
        degree = n - 1
    if threshold is not None:
        if not 1 <= threshold <= degree:
            raise ConfigError(bad_value("threshold", threshold, f"use 1 <= threshold <= degree = {degree}"))
        return params(degree, threshold, "explicit")
    if server_model == "malicious" and n <= complete_up_to and degree in (None, n - 1):
        t = (n - 1 + c) // 2 + 1
        if t > n - 1 or t < 2 or q > n:
            raise ConfigError(
                bad_value(
                    "clients",
                    n,
                    f"with c = {c} colluding site(s) no safe SecAgg parameters exist for {n} sites (need "
                    f"2t > n - 1 + c with 2 <= t <= n - 1 and a quorum 2q > n + c with q <= n); use more sites or a "
                    "smaller colluders bound",
                )
            )
        return params(n - 1, t, "malicious-complete")
    return _search_threat_model(
        n,
        degree,
        params,
        dropout_rate=dropout_rate,
        corrupt_fraction=corrupt_fraction,
        security_bits=security_bits,
        correctness_bits=correctness_bits,
        server_model=server_model,
        c=c,
    )


def harary_graph(n: int, k: int, seed: bytes) -> list[frozenset]:
    """Neighbour sets of H(n, k) under a random relabelling derived from a public ``seed``.

    The permutation comes from a numpy Generator seeded with SHA-256(seed): the graph is public, so
    statistical (not secret) randomness is the right kind here (Bell et al. 2020, §3.1).
    """
    if not 1 <= k <= n - 1:
        raise ConfigError(bad_value("degree", k, f"use 1 <= degree <= {n - 1}"))
    if k == n - 1:
        return [frozenset(j for j in range(n) if j != i) for i in range(n)]
    if k % 2 == 1 and n % 2 == 1:
        raise ConfigError(bad_value("degree", k, "an odd degree needs an even number of clients"))
    digest = hashlib.sha256(b"securefed/harary/v1|" + seed).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))
    perm = rng.permutation(n)  # ring position -> client id
    nbrs: list[set] = [set() for _ in range(n)]
    half = k // 2
    for pos in range(n):
        a = int(perm[pos])
        offsets = list(range(1, half + 1))
        if k % 2 == 1:
            offsets.append(n // 2)
        for off in offsets:
            b = int(perm[(pos + off) % n])
            nbrs[a].add(b)
            nbrs[b].add(a)
    return [frozenset(s) for s in nbrs]
