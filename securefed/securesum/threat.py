"""The threat model, enforced by the sites: each site refuses a round spec that could expose it.

A site (hospital) does not trust the coordinator; it trusts its own node configuration. Before it computes
anything for a secure sum it checks the announced spec against floors from its options (Flower node-config
keys, :attr:`securefed.federation.site.SiteWorker.options`) and refuses — a :class:`ProtocolError` naming
the option and the fix — any spec under which a server colluding with up to c sites could read its input
(docs/threat-model-secure-sum.md). The options and their defaults (``SECAGG_OPTIONS``, ``CKKS_OPTIONS``):

SecAgg+ (:func:`check_secagg_spec`)

``secagg-max-colluders``   c, sites that may collude with the server (default ``⌈n/10⌉``, at least 1)
``secagg-min-threshold``   floor for the Shamir threshold t (default 2)
``secagg-complete-up-to``  the degree floor: up to this many sites the graph must be complete (default 128)
``secagg-security-bits``   σ of the sparse-graph leak and cut bounds (default 40)
``secagg-min-survivors``   floor for |U| when signing the survivor set (default: the quorum q)
``dp-colluders``           c for the distributed-DP floor |U| ≥ t_DP + c (default 0; see the docs)

and always: 2t > k + c (share condition), 2q > n + c (global quorum), the cut bound, a weight the fixed-point
plan can hold. CKKS (:func:`check_ckks_spec`): ``ckks-min-survivors`` (2), ``ckks-allow-minority-quorum``
(false), ``ckks-allow-signature-verify`` (false), ``ckks-flood-bits`` (40, the λ floor of the decryption
noise flood), ``ckks-max-fallbacks`` (1, sites besides the key holder that may receive the secret key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError, ProtocolError, bad_value
from .graph import COMPLETE_UP_TO, check_parameters, default_colluders, default_quorum

__all__ = [
    "SECAGG_OPTIONS",
    "CKKS_OPTIONS",
    "SecAggFloors",
    "check_secagg_spec",
    "check_ckks_spec",
    "int_option",
    "truthy",
]

SECAGG_OPTIONS = {
    "secagg-max-colluders": "⌈n/10⌉, at least 1",
    "secagg-min-threshold": 2,
    "secagg-complete-up-to": COMPLETE_UP_TO,
    "secagg-security-bits": 40,
    "secagg-min-survivors": "the quorum q",
    "dp-colluders": 0,
}
CKKS_OPTIONS = {
    "ckks-min-survivors": 2,
    "ckks-allow-minority-quorum": False,
    "ckks-allow-signature-verify": False,
    "ckks-flood-bits": 40,
    "ckks-max-fallbacks": 1,
}


def truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def int_option(options: dict, key: str, default, minimum: int = 0, what: str = "") -> int:
    """A non-negative integer site option (an int, or a string / float holding one), else ConfigError."""
    raw = (options or {}).get(key, default)
    try:
        v = int(raw)
        ok = v >= minimum and float(raw) == v
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(bad_value(f"site option {key}", raw, f"use an integer >= {minimum}{what}"))
    return v


@dataclass(frozen=True)
class SecAggFloors:
    """What a site enforces in its SecAgg+ client for one round (from its options and the spec)."""

    colluders: int
    quorum: int
    min_survivors: int


def _refuse(problem: str, fix: str):
    raise ProtocolError(f"the server's SecAgg+ round spec is refused before anything is computed: {problem}. {fix}")


def check_secagg_spec(spec, options: dict | None = None, *, weight: float | None = None, dp_t: int = 0) -> SecAggFloors:
    """Refuse (``ProtocolError``) a SecAgg+ spec weaker than this site's floors; return the floors to enforce.

    Parameters
    ----------
    spec : RoundSpec or SetupSpec
        As decoded from the server's ``secagg-start`` (late-bound schedule: the setup part at set-up time, then
        the joined full spec with ``weight`` when the input part arrives).
    options : dict
        The site's options (module docstring).
    weight : float, optional
        This site's own weight (from its own data); refused if the spec's fixed-point plan cannot hold it.
    dp_t : int
        Under distributed DP noise, the plan's t (each site adds a 1/√t share of the noise).
    """
    o = dict(options or {})
    n, k, t, q = spec.n_clients, spec.degree, spec.threshold, spec.signatures_needed
    c = int_option(o, "secagg-max-colluders", default_colluders(n), 0)
    min_t = int_option(o, "secagg-min-threshold", 2, 1)
    complete = int_option(o, "secagg-complete-up-to", COMPLETE_UP_TO, 0)
    bits = int_option(o, "secagg-security-bits", 40, 1)
    floor = int_option(o, "secagg-min-survivors", 0, 0)
    dp_c = int_option(o, "dp-colluders", 0, 0)
    if c >= n:
        _refuse(
            f"this site assumes up to secagg-max-colluders = {c} colluding sites among only {n}",
            "No secure sum is possible; run with more sites",
        )
    problems = check_parameters(n, k, t, q, c, security_bits=bits, complete_up_to=complete, min_threshold=min_t)
    if problems:
        _refuse(
            "; ".join(problems),
            "The server must announce parameters from securefed.securesum.graph."
            f"choose_parameters(n, colluders={c}) (e.g. t = {(n - 1 + c) // 2 + 1}, q = {default_quorum(n, c)} for "
            f"the complete graph), or this site's operator must relax the named option in the node config "
            "(secagg-max-colluders, secagg-min-threshold, secagg-complete-up-to, secagg-security-bits)",
        )
    min_surv = max(q, floor, 2)
    if dp_t:
        need = dp_t + dp_c
        if need > n:
            _refuse(
                f"under distributed DP noise with t = {dp_t} and dp-colluders = {dp_c}, a sum needs "
                f"{need} survivors but the round has {n} sites",
                "Run with a smaller DP min_survivors (t <= n - dp-colluders) or lower dp-colluders",
            )
        min_surv = max(min_surv, need)
    if min_surv > n:
        _refuse(f"secagg-min-survivors = {floor} exceeds the {n} sites of the round", "Lower secagg-min-survivors")
    if weight is not None:  # a late-bound round's setup part has no plan yet: check it again with the full spec
        fp = spec.fixed_point
        if not (math.isfinite(weight) and 0 <= weight <= fp.weight_total):
            _refuse(
                f"this site's own weight {weight:g} does not fit the fixed-point plan's total weight "
                f"{fp.weight_total:g} (the sum could overflow)",
                "The server must plan with the sites' announced weights",
            )
    return SecAggFloors(c, q, min_surv)


def check_ckks_spec(spec, options: dict | None = None, dp_t: int = 0, *, weight: float | None = None) -> None:
    """Refuse a server-announced CKKS spec weaker than this site's floors (:class:`ProtocolError`).

    Floors: ``ckks-min-survivors`` (default 2), a majority quorum unless ``ckks-allow-minority-quorum``,
    ``verify="recompute"`` unless ``ckks-allow-signature-verify``, the flood λ ≥ ``ckks-flood-bits`` (40), at
    most ``ckks-max-fallbacks`` (1) fallback decryptors holding the secret key, and under distributed DP
    noise ``min_survivors ≥ t``. ``weight``: this site's own weight, whose clipped contribution must fit the
    spec's bound on |sum| (else an honest upload could be taken for a lie by the range check).
    """
    nc = dict(options or {})
    floor = int_option(nc, "ckks-min-survivors", 2, 1, " (the fewest sites a decrypted CKKS sum may cover)")
    if spec.min_survivors < floor:
        raise ProtocolError(
            f"the server's CKKS round lets a sum over min_survivors = {spec.min_survivors} site(s) be "
            f"decrypted, below this site's floor ckks-min-survivors = {floor} (a smaller sum could "
            "expose this site's update); refusing. To accept, lower ckks-min-survivors in this "
            "SuperNode's node config"
        )
    majority = spec.n_clients // 2 + 1
    if spec.signatures_needed < majority and not truthy(nc.get("ckks-allow-minority-quorum", False)):
        raise ProtocolError(
            f"the server's CKKS round needs only quorum = {spec.signatures_needed} survivor-set "
            f"signatures of {spec.n_clients} sites, below a majority ({majority}): a malicious server "
            "could get two survivor sets decrypted and difference them; refusing. To accept, set "
            "ckks-allow-minority-quorum=true in this SuperNode's node config"
        )
    if spec.verify != "recompute" and not truthy(nc.get("ckks-allow-signature-verify", False)):
        raise ProtocolError(
            f"the server's CKKS round uses verify = {spec.verify!r}: the decryptor would decrypt the "
            "server's claimed sum unchecked (a malicious server could substitute one site's upload); "
            "refusing. To accept, set ckks-allow-signature-verify=true in this SuperNode's node config"
        )
    lam = int_option(nc, "ckks-flood-bits", 40, 1)
    if spec.flood_bits < lam:
        raise ProtocolError(
            f"the server's CKKS round floods decryptions to only {spec.flood_bits} bits of security, "
            f"below this site's floor ckks-flood-bits = {lam} (the released sums would leak more about "
            "the secret key); refusing. To accept, lower ckks-flood-bits in this SuperNode's node config"
        )
    max_fb = int_option(nc, "ckks-max-fallbacks", 1, 0)
    if len(spec.fallbacks) > max_fb:
        raise ProtocolError(
            f"the server's CKKS round hands the secret key to {len(spec.fallbacks)} fallback decryptors "
            f"besides the key holder, above this site's ckks-max-fallbacks = {max_fb} (each of them "
            "together with the server reads every upload); refusing. To accept, raise ckks-max-fallbacks"
        )
    if dp_t and spec.min_survivors < dp_t:
        raise ProtocolError(
            f"the request's DP plan uses distributed noise with t = {dp_t} (each site adds a 1/sqrt(t) "
            f"share), but the CKKS round decrypts sums over min_survivors = {spec.min_survivors} < t "
            "sites, which would carry too little noise; refusing. The server must run with "
            f"ckks-min-survivors >= {dp_t}"
        )
    if weight is not None and not (math.isfinite(weight) and 0 <= weight * spec.clip <= spec.max_abs_sum):
        raise ProtocolError(
            f"this site's weight {weight:g} × clip {spec.clip:g} exceeds the spec's bound on |sum| "
            f"{spec.max_abs_sum:g}; refusing (the server must plan with the announced weights)"
        )
