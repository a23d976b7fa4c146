"""The CKKS secure sum of the coordinator (:func:`securefed.federation.sums.secure_sum`) with site workers, no Flower.

The exchange rebuilds every site from its stored state before each message (as a Flower ClientApp process),
and can make a site silent from its k-th request on (a crashed node), lose a reply (a partitioned site) or
let a malicious server rewrite a request.
"""

import json

import numpy as np
import pytest

from securefed.errors import ConfigError, ProtocolAbortedError
from securefed.federation import Coordinator, InMemoryExchange, SiteWorker
from securefed.federation.coordinator import Sites
from securefed.federation.inprocess import _rebind_digest
from securefed.federation.messages import request_digest
from securefed.federation.wire import put_array
from securefed.federation.site import as_task, compute_upload
from securefed.federation.sums import check_spec_floors, ckks_round_spec, dp_min_survivors, secure_sum
from securefed.plan import RunPlan
from securefed.securesum import crypto
from securefed.securesum.ckks import release_error_bound

TASK = {"task": "stats", "want": ["moments"], "scale": 2.0}
OUT_SHAPE = [6]


class FaultyExchange(InMemoryExchange):
    """``drop={site: k}``: silent from its k-th request on; ``lose={site: k}``: the k-th reply is lost;
    ``tamper(site, fields)`` rewrites a request before delivery (a malicious server)."""

    def __init__(self, workers, drop=None, lose=None, tamper=None):
        super().__init__(workers, fresh_process=True)
        self.drop, self.lose, self.tamper = dict(drop or {}), dict(lose or {}), tamper
        self.count = {a: 0 for a in workers}
        self.seen_ops = []

    def request(self, payloads, deadline):
        out = {}
        for a, fields in payloads.items():
            k = self.count[a]
            self.count[a] += 1
            self.seen_ops.append((a, fields["op"]))
            if a in self.drop and k >= self.drop[a]:
                continue
            if self.tamper is not None:
                fields = self.tamper(a, dict(fields))
            rep = super().request({a: fields}, deadline)
            if self.lose.get(a) == k:
                continue
            out.update(rep)
        if len(out) < len(payloads):
            self.clock = max(self.clock, deadline)
        return out


@pytest.fixture
def arrays():
    rng = np.random.default_rng(5)
    return [rng.normal(size=(30 + 5 * i, 3)) * 0.4 + 0.3 * i for i in range(3)]


def _setup(arrays, options=None, **plan_kw):
    workers = {
        i: SiteWorker({"site-name": f"s{i}", "allow-paper-mode": True, **(options or {})}, X)
        for i, X in enumerate(arrays)
    }
    plan = RunPlan.build(
        "flower", **{**dict(aggregation="ckks", value_bound=1.0, method="none", seed=3, audit_holdout=0.0), **plan_kw}
    )
    co = Coordinator(plan)
    keys = [crypto.ed25519_public_bytes(w.identity()) for w in workers.values()]
    co.sites = Sites([f"s{i}" for i in range(3)], [len(X) for X in arrays], [0] * 3, 3, keys, [0, 1, 2], {0, 1, 2})
    return co, workers


def _sum(co, ex, clip=1.0, weights="uniform"):
    gen = secure_sum(co, as_task(TASK), "moments", clip, weights=weights, out_shape=OUT_SHAPE)
    step = next(gen)
    while True:
        reply = ex.request(step.payloads, step.deadline)
        co.now = ex.now()
        try:
            step = gen.send(reply)
        except StopIteration as stop:
            return stop.value


def _expected(arrays, w, survivors, clip):
    ups = [compute_upload(TASK, X, None) for X in arrays]
    return sum(w[i] * np.clip(ups[i], -clip, clip) for i in survivors)


def _ex(workers, **kw):
    for w in workers.values():  # the identity keys exist (announced) before the first message
        w.identity()
    return FaultyExchange(workers, **kw)


def test_ckks_sum_equals_the_weighted_sum_and_forgets_the_secret(arrays):
    co, workers = _setup(arrays, ckks_precision=1e-7)
    ex = _ex(workers)
    res = _sum(co, ex, weights="records")
    step = res.details["precision"]
    assert step <= 1e-7 and res.protocol == "ckks" and res.survivors == (0, 1, 2)
    w = np.array([len(X) for X in arrays], float)
    assert res.weight_sum == pytest.approx(w.sum())
    assert np.max(np.abs(res.total - _expected(arrays, w, (0, 1, 2), 1.0))) < release_error_bound(step) * w.sum()
    assert res.details["decryptor"] == 0 and res.details["verify"] == "recompute"
    assert all("ckks_client" not in w.state and "ckks_spec" not in w.state for w in ex.workers.values())


@pytest.mark.parametrize(
    "site,k,survivors,decryptor",
    [
        (0, 3, (0, 1, 2), 1),  # key holder confirmed U, then silent when asked to decrypt: the next site decrypts
        (0, 2, (0, 1, 2), 1),  # key holder silent from the survivor-set confirmation on: same
        (2, 1, (0, 1), 0),  # a site silent at the handoff: left out of the sum
        (1, 0, (0, 2), 0),  # a site silent from the start
    ],
)
def test_dropouts(arrays, site, k, survivors, decryptor):
    co, workers = _setup(arrays)
    res = _sum(co, _ex(workers, drop={site: k}))
    assert res.survivors == survivors and res.details["decryptor"] == decryptor
    assert np.max(np.abs(res.total - _expected(arrays, np.ones(3), survivors, 1.0))) < release_error_bound(
        res.details["precision"]
    )
    assert co.sites.live == set(survivors)


def test_key_holder_dropping_at_handoff_aborts_and_a_dead_key_holder_is_replaced(arrays):
    co, workers = _setup(arrays)
    ex = _ex(workers, drop={0: 1})
    with pytest.raises(ProtocolAbortedError, match="key holder"):
        _sum(co, ex)
    assert "ckks_client" not in ex.workers[1].state and (1, "ckks-end") in ex.seen_ops  # the abort is announced
    co, workers = _setup(arrays)
    co.sites.live.discard(0)
    ex = _ex(workers)
    res = _sum(co, ex)
    assert res.details["key_holder"] == 1 and res.survivors == (1, 2)
    assert (0, "ckks-start") not in ex.seen_ops


def test_malicious_server_cannot_get_one_sites_ciphertext_decrypted(arrays):
    """The server swaps the sum in the DecryptRequest for site 1's own upload: every decryptor refuses."""
    from dataclasses import replace

    from securefed.securesum.messages import DecryptRequest, decode, encode, peek_header

    def swap(a, fields):
        if fields["op"] == "ckks-msgs":
            msgs = []
            for m in fields["msgs"]:
                if peek_header(m)[0] is DecryptRequest:
                    r = decode(m)
                    m = encode(replace(r, chunks=r.uploads[1].chunks))
                msgs.append(m)
            fields["msgs"] = msgs
        return fields

    co, workers = _setup(arrays)
    ex = _ex(workers, tamper=swap)
    with pytest.raises(ProtocolAbortedError, match="decrypt"):
        _sum(co, ex)
    # both key holders (the key holder 0 and its one fallback 1) refused; site 2 holds no secret key
    assert all("AuthenticationError" in co.sites.silent[i] and "refused" in co.sites.silent[i] for i in (0, 1))
    assert 2 not in co.sites.silent
    assert all("ckks_client" not in w.state for w in ex.workers.values())


def test_site_reports_errors_instead_of_crashing(arrays):
    w = SiteWorker({"allow-paper-mode": True, "site-name": "s0"}, arrays[0])
    rep = w.handle({"op": "ckks-msgs", "msgs": [b"junk"]})
    assert rep["error"].startswith("ProtocolError") and "no CKKS round" in rep["error"]
    rep = w.handle({"op": "ckks-start", "spec": b"{bad", "site": 0})
    assert rep["error"].startswith("DecodeError")
    co, workers = _setup(arrays)
    ex = _ex(workers)
    _sum(co, ex)
    assert {op for _, op in ex.seen_ops} == {"ckks-start", "ckks-msgs", "ckks-end"}


def test_value_bound_is_required():
    with pytest.raises(ConfigError, match="value-bound"):
        RunPlan.build("flower", aggregation="ckks")


def test_too_few_live_sites_abort_instead_of_releasing_one_update(arrays):
    co, workers = _setup(arrays)
    co.sites.live = {2}
    ex = _ex(workers)
    with pytest.raises(ProtocolAbortedError, match="min_survivors"):
        _sum(co, ex)
    assert ex.seen_ops == []
    co, workers = _setup(arrays, ckks_min_survivors=1)
    co.sites.live = {2}
    with pytest.raises(ProtocolAbortedError, match="confirm the survivor set"):  # a single site is no majority of 3
        _sum(co, _ex(workers))
    # the server's opt-in alone is not enough: the site's own floors refuse the weak spec ...
    co, workers = _setup(arrays, ckks_min_survivors=1, ckks_quorum=1)
    co.sites.live = {2}
    ex = _ex(workers)
    with pytest.raises(ProtocolAbortedError):
        _sum(co, ex)
    assert "ckks-min-survivors" in co.sites.silent[2] and "ckks_client" not in ex.workers[2].state
    # ... the site's operator must opt in too
    co, workers = _setup(
        arrays, {"ckks-min-survivors": 1, "ckks-allow-minority-quorum": "true"}, ckks_min_survivors=1, ckks_quorum=1
    )
    co.sites.live = {2}
    assert _sum(co, _ex(workers)).survivors == (2,)  # an explicit opt-in on both sides


# ------------------------------------------------------------------ the site's floors against a malicious server


def _start_fields(workers, **spec_kw):
    """A ``ckks-start`` for site 1 with a spec the (malicious) server chose."""
    from securefed.securesum.ckks import CKKSRoundSpec, choose_ckks_parameters, encode_ckks_spec

    params = choose_ckks_parameters(6, 1e-6, 3.0, 3)
    kw = dict(
        session_id=b"x" * 16,
        round_index=0,
        n_clients=3,
        key_holder=0,
        params=params,
        clip=1.0,
        identity_keys=tuple(crypto.ed25519_public_bytes(workers[i].identity()) for i in range(3)),
        min_survivors=2,
        verify="recompute",
        quorum=0,
    )
    kw.update(spec_kw)
    fields = dict(TASK, op="ckks-start", site=1, seed=3, weights="uniform")
    kw.setdefault("task_digest", request_digest(fields))  # the spec names the request the site receives
    return dict(fields, spec=encode_ckks_spec(CKKSRoundSpec(**kw)))


WEAK = {  # spec change → (site option named in the refusal, site options that accept it)
    "min_survivors=1": (dict(min_survivors=1), "ckks-min-survivors", {"ckks-min-survivors": 1}),
    "quorum=1": (dict(quorum=1), "ckks-allow-minority-quorum", {"ckks-allow-minority-quorum": True}),
    "quorum=1 of 3 (string flag)": (
        dict(quorum=1),
        "ckks-allow-minority-quorum",
        {"ckks-allow-minority-quorum": "yes"},
    ),
    "verify=signatures": (
        dict(verify="signatures"),
        "ckks-allow-signature-verify",
        {"ckks-allow-signature-verify": "true"},
    ),
}


@pytest.mark.parametrize("what", list(WEAK))
def test_site_refuses_a_spec_below_its_floors_and_accepts_with_the_allow_key(arrays, what):
    change, key, allow = WEAK[what]
    _, workers = _setup(arrays)
    for opts in ({}, {"ckks-allow-minority-quorum": "false", "ckks-allow-signature-verify": 0}):
        w = SiteWorker({"allow-paper-mode": True, "site-name": "s1", **opts}, arrays[1], state=dict(workers[1].state))
        rep = w.handle(_start_fields(workers, **change))
        assert rep["error"].startswith("ProtocolError") and key in rep["error"] and "refusing" in rep["error"]
        assert "ckks_client" not in w.state and "rng" not in w.state  # nothing computed, stored or sent
    w = SiteWorker({"allow-paper-mode": True, "site-name": "s1", **allow}, arrays[1], state=dict(workers[1].state))
    rep = w.handle(_start_fields(workers, **change))
    assert "error" not in rep and len(rep["msgs"]) == 1 and "ckks_client" in w.state
    w = SiteWorker({"allow-paper-mode": True, "site-name": "s1"}, arrays[1], state=dict(workers[1].state))
    assert "error" not in w.handle(_start_fields(workers))  # the default spec passes the default floors


def test_site_floor_from_distributed_dp_noise_and_bad_options(arrays):
    _, workers = _setup(arrays)
    plan = {"noise": "distributed", "min_survivors": None, "sizes": [30, 35, 40]}  # t = all 3 sites
    f = {k: v for k, v in _start_fields(workers, min_survivors=2).items() if k not in TASK}  # a DP gradient upload
    f = put_array(dict(f, task="gradient", gamma=1.0, dp=json.dumps(plan)), "Y", np.zeros((2, 2)))
    f = _rebind_digest(f)  # the round spec names this request
    rep = SiteWorker({"allow-paper-mode": True, "site-name": "s1"}, arrays[1], state=dict(workers[1].state)).handle(f)
    assert (
        rep["error"].startswith("ProtocolError")
        and "t = 3" in rep["error"]
        and "ckks-min-survivors >= 3" in rep["error"]
    )
    rep = SiteWorker(
        {"allow-paper-mode": True, "site-name": "s1", "ckks-min-survivors": 1}, arrays[1], state=dict(workers[1].state)
    ).handle(f)
    assert "t = 3" in rep["error"]  # a site option does not lower the DP floor
    from securefed.securesum.ckks import decode_ckks_spec

    check_spec_floors(decode_ckks_spec(f["spec"]), None, json.dumps(dict(plan, min_survivors=2)))
    assert dp_min_survivors(dict(plan, noise="local")) == 0 and dp_min_survivors(None) == 0
    assert dp_min_survivors(json.dumps(plan)) == 3
    for bad in ("abc", 0, -1, 1.5):
        rep = SiteWorker({"allow-paper-mode": True, "site-name": "s1", "ckks-min-survivors": bad}, arrays[1]).handle(
            _start_fields(workers)
        )
        assert rep["error"].startswith("ConfigError") and "ckks-min-survivors" in rep["error"]


def test_malicious_server_announcing_min_survivors_1_gets_nothing(arrays):
    """A server announces min_survivors = quorum = 1; every site refuses at the start."""
    co, workers = _setup(arrays, ckks_min_survivors=1, ckks_quorum=1)
    ex = _ex(workers)
    with pytest.raises(ProtocolAbortedError):
        _sum(co, ex)
    assert all("ckks-min-survivors" in co.sites.silent[i] for i in range(3))
    assert {op for _, op in ex.seen_ops if op != "ckks-end"} == {"ckks-start"}  # no upload ever left a site
    assert all("ckks_client" not in w.state for w in ex.workers.values())


def test_server_spec_carries_the_dp_t_under_distributed_noise(arrays):
    dp = dict(epsilon=1.0, clip_norm=1.0, noise="distributed", rule="gradient")
    w = np.ones(3)
    co, _ = _setup(arrays, **dp)
    assert ckks_round_spec(co, w, 6, 1.0).min_survivors == 3
    co, _ = _setup(arrays, **dp, min_survivors=2)
    assert ckks_round_spec(co, w, 6, 1.0).min_survivors == 2
    co, _ = _setup(arrays, epsilon=1.0, clip_norm=1.0)
    assert ckks_round_spec(co, w, 6, 1.0).min_survivors == 2
    co, _ = _setup(arrays, **dp, min_survivors=3, ckks_min_survivors=2)
    with pytest.raises(ConfigError, match="ckks-min-survivors"):
        ckks_round_spec(co, w, 6, 1.0)
    co, _ = _setup(arrays, **dp)
    co.sites.live.discard(2)
    with pytest.raises(ProtocolAbortedError, match="min_survivors = 3"):
        ckks_round_spec(co, w, 6, 1.0)


def test_clipped_coordinates_reach_the_result_and_warn(arrays):
    import warnings

    from securefed.securesum.quantize import ClippingWarning

    clip = 0.05
    ups = [compute_upload(TASK, X, None) for X in arrays]
    per_site = [int(np.sum(np.abs(u) > clip)) for u in ups]
    assert all(c > 0 for c in per_site) and not all(c == 6 for c in per_site)
    co, workers = _setup(arrays)
    with pytest.warns(ClippingWarning, match=f"{sum(per_site)} update coordinates"):
        res = _sum(co, _ex(workers), clip=clip)
    assert res.clipped == sum(per_site)
    assert np.max(np.abs(res.total - _expected(arrays, np.ones(3), (0, 1, 2), clip))) < release_error_bound(
        res.details["precision"]
    )
    co, workers = _setup(arrays)
    with pytest.warns(ClippingWarning):
        res = _sum(co, _ex(workers, drop={1: 0}), clip=clip)
    assert res.survivors == (0, 2) and res.clipped == per_site[0] + per_site[2]
    co, workers = _setup(arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ClippingWarning)
        assert _sum(co, _ex(workers), clip=100.0).clipped == 0


def test_ckks_end_reaches_a_non_survivor_that_holds_the_secret_context(arrays):
    """Site 1, the fallback decryptor, processes its key handoff (so it holds the secret context) but its
    upload is lost: it is not a survivor, yet it must be told to drop the context. Site 2 never held it."""
    from securefed.securesum.ckks import CKKSClient, decode_ckks_spec

    held = {}

    def watch(a, fields):
        if a in (1, 2) and fields["op"] == "ckks-end" and "ckks_client" in ex.workers[a].state:
            st = ex.workers[a].state
            held[a] = CKKSClient.load(
                st["ckks_client"], decode_ckks_spec(st["ckks_spec"]), ex.workers[a].identity()
            )._ctx.is_private()
        return fields

    co, workers = _setup(arrays)
    ex = _ex(workers, lose={1: 1}, tamper=watch)
    res = _sum(co, ex)
    assert res.survivors == (0, 2) and held == {1: True, 2: False} and res.details["fallbacks"] == [1]
    assert all("ckks_client" not in w.state and "ckks_spec" not in w.state for w in ex.workers.values())
