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

1. **Privacy of the shares** (:func:`share_leak_probability`). Honest-but-curious server (securefed's
   threat model, DESIGN §2): a client's secrets leak only if t of its k neighbours are corrupt,
   ``n · P[Hyp(n−1, ⌈γn⌉, k) ≥ t] ≤ 2^−σ``. Actively malicious server (``server_model="malicious"``):
   an honest client releases one kind of share per peer, so with c corrupt neighbours the server can
   combine at most c + (k − c)/2 shares of a kind; require 2t > k + c, i.e.
   ``n · P[Hyp(n−1, ⌈γn⌉, k) ≥ 2t − k] ≤ 2^−σ``.
2. **Connectivity** (:func:`disconnect_probability`): the graph left after removing corrupt and dropped
   nodes must stay connected, or the server learns partial sums. H(n, k) under a random labelling
   disconnects only if ⌊k/2⌋ ring-consecutive nodes are all removed:
   ``n · P[⌊k/2⌋ given nodes all removed] ≤ 2^−σ`` with removal probability γ + δ − γδ.
3. **Correctness** (:func:`dropout_failure_probability`): every client keeps ≥ t live neighbours,
   ``n · P[Bin(k, δ) > k − t] ≤ 2^−η``.

The smallest k meeting all three is returned, with the *largest* t that still meets the correctness
bound (more colluders are then needed to break a client); the full graph is the
fallback. If even the full graph cannot meet them, a :class:`ConfigError` says which bound fails.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..errors import ConfigError, bad_value

__all__ = ["GraphParams", "harary_graph", "choose_parameters", "share_leak_probability",
           "disconnect_probability", "dropout_failure_probability"]


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

    def as_dict(self) -> dict:
        def fin(v):  # JSON has no -inf: None means "probability exactly 0"
            return None if v == -math.inf else round(v, 3)

        return dict(n=self.n, degree=self.degree, threshold=self.threshold, log2_leak=fin(self.log2_leak),
                    log2_disconnect=fin(self.log2_disconnect), log2_dropout_failure=fin(self.log2_dropout_failure),
                    source=self.source)


def _log2(p: float) -> float:
    return -math.inf if p <= 0 else math.log2(p)


def share_leak_probability(n: int, k: int, t: int, corrupt_fraction: float, server_model: str = "semi-honest") -> float:
    """Bell et al. 2020, Lemma 3.5 (privacy): ``n · P[Hyp(n−1, ⌈γn⌉, k) ≥ need]`` (capped at 1).

    ``need = t`` for an honest-but-curious server, ``2t − k`` for a malicious one.
    """
    corrupt = int(math.ceil(corrupt_fraction * n - 1e-9))
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


def dropout_failure_probability(n: int, k: int, t: int, dropout_rate: float) -> float:
    """Correctness: ``n · P[Bin(k, δ) > k − t]`` — some client keeps fewer than t live neighbours."""
    p = float(stats.binom.sf(k - t, k, dropout_rate))
    return min(1.0, n * p)


def choose_parameters(n: int, *, degree: int | None = None, threshold: int | None = None,
                      dropout_rate: float = 0.1, corrupt_fraction: float = 0.1,
                      security_bits: float = 40.0, correctness_bits: float = 10.0,
                      server_model: str = "semi-honest") -> GraphParams:
    """Pick (k, t) for ``n`` clients from the threat model, or check explicitly given ones.

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
    server_model : {"semi-honest", "malicious"}
        Which privacy condition to enforce (see the module docstring).
    """
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
        raise ConfigError(bad_value("degree", degree, "an odd degree needs an even number of clients; use an even degree"))
    if threshold is not None and degree is None:
        degree = n - 1
    if threshold is not None:
        if not 1 <= threshold <= degree:
            raise ConfigError(bad_value("threshold", threshold, f"use 1 <= threshold <= degree = {degree}"))
        return GraphParams(n, degree, threshold,
                           _log2(share_leak_probability(n, degree, threshold, corrupt_fraction, server_model)),
                           _log2(disconnect_probability(n, degree, corrupt_fraction, dropout_rate)),
                           _log2(dropout_failure_probability(n, degree, threshold, dropout_rate)), "explicit")
    sec, cor = 2.0 ** -security_bits, 2.0 ** -correctness_bits
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
            leak = share_leak_probability(n, k, t, corrupt_fraction, server_model)
            if leak > sec:
                continue
            drop = dropout_failure_probability(n, k, t, dropout_rate)
            if drop > cor:
                break  # larger t only makes dropout failures likelier
            best = GraphParams(n, k, t, _log2(leak), _log2(dis), _log2(drop), "threat-model")
        if best is not None:
            return best
        failures.append(f"k={k}: no t has share leak <= 2^-{security_bits:g} and dropout failure <= 2^-{correctness_bits:g}")
    raise ConfigError(bad_value(
        "threat model", dict(clients=n, dropout_rate=dropout_rate, corrupt_fraction=corrupt_fraction,
                             security_bits=security_bits, correctness_bits=correctness_bits),
        "no degree/threshold meets these bounds (" + "; ".join(failures[-3:]) + "); lower the dropout rate or the "
        "corrupt fraction, relax security_bits/correctness_bits, or give degree and threshold explicitly"))


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
