"""CKKS secure sum over the Flower logic without Flower: ``server_ckks_sum`` + ``site_handle_ckks``.

Every site request is answered by ``site_handle_ckks`` with a fresh ``SiteState`` rebuilt from the
stored bytes (as a fresh ClientApp process would), so the CKKS client machine — and the TenSEAL secret
context on key-holding sites — must survive the store/load between messages.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from securefed.errors import ProtocolAbortedError
from securefed.securesum.ckks import release_error_bound
from securefed.flower.ckks_flow import server_ckks_sum, site_handle_ckks
from securefed.flower.site import SiteState, compute_update
from securefed.flower.transport import payload_size


class MemoryExchange:
    """The ``Exchange`` interface, delivered in process to ``site_handle_ckks``.

    ``drop={site: k}`` makes a site silent from its k-th request on (0 = ckks-start), like a crashed
    SuperNode; ``lose={site: k}``: the site processes its k-th request but the reply is lost (a slow or
    partitioned site, alive afterwards); ``tamper(cid, fields)`` may rewrite a request before delivery (a
    malicious server); ``node_config`` (one dict for every site) is each SuperNode's node config.
    """

    def __init__(self, arrays, drop=None, tamper=None, lose=None, node_config=None):
        self.arrays = arrays
        self.lose, self.node_config = dict(lose or {}), node_config
        self.nodes = {i: 1000 + i for i in range(len(arrays))}
        self.states = {i: {} for i in self.nodes}
        self.bytes_to = {i: 0 for i in self.nodes}
        self.bytes_from = {i: 0 for i in self.nodes}
        self.silent, self.messages, self.clock = {}, 0, 0.0
        self.drop, self.dead, self.count = dict(drop or {}), set(), {i: 0 for i in self.nodes}
        self.tamper = tamper
        self.seen_ops = []

    def now(self):
        return self.clock

    def identity(self, cid):
        st = SiteState(dict(self.states[cid]))
        key = st.identity()
        self.states[cid] = dict(st.data)
        from securefed.securesum import crypto
        return crypto.ed25519_public_bytes(key)

    def request(self, payloads, deadline, on_reply=None):
        out = {}
        for cid, fields in payloads.items():
            k = self.count[cid]
            self.count[cid] += 1
            self.messages += 1
            self.bytes_to[cid] += payload_size(fields)
            self.seen_ops.append((cid, fields["op"]))
            if cid in self.dead or (cid in self.drop and k >= self.drop[cid]):
                self.dead.add(cid)
                self.silent[cid] = "no reply"
                continue
            if self.tamper is not None:
                fields = self.tamper(cid, dict(fields))
            st = SiteState(dict(self.states[cid]))  # a fresh process: only the stored bytes survive
            rep = site_handle_ckks(dict(fields), self.arrays[cid], st, compute_update, self.node_config)
            self.states[cid] = dict(st.data)
            if self.lose.get(cid) == k:
                self.silent[cid] = "no reply"
                continue
            self.bytes_from[cid] += payload_size(rep)
            out[cid] = rep
            if on_reply is not None:
                on_reply(cid, rep)
        if len(out) < len(payloads):
            self.clock = max(self.clock, deadline)  # the missing replies time out
        return out


@pytest.fixture
def arrays():
    rng = np.random.default_rng(5)
    return [rng.normal(size=(30 + 5 * i, 3)) * 0.4 + 0.3 * i for i in range(3)]


def _sites(ex):
    n = len(ex.arrays)
    return SimpleNamespace(names=[f"s{i}" for i in range(n)], sizes=[len(X) for X in ex.arrays], n_features=3,
                           identities=tuple(ex.identity(i) for i in range(n)), live=set(range(n)))


def _cfg(tmp_path, **kw):
    return SimpleNamespace(out_dir=str(tmp_path / "out"), seed=3, **kw)


TASK = {"task": "moments", "scale": 2.0, "out_shape": [6], "seed": 3}


def _expected(arrays, w, survivors, clip):
    ups = [compute_update(TASK, X, None) for X in arrays]
    return sum(w[i] * np.clip(ups[i], -clip, clip) for i in survivors)


def test_ckks_sum_over_flower_logic_equals_weighted_sum(arrays, tmp_path):
    ex = MemoryExchange(arrays)
    sites = _sites(ex)
    w = np.array([0.2, 0.3, 0.5])
    res = server_ckks_sum(ex, _cfg(tmp_path, ckks_precision=1e-7), sites, dict(TASK), w, "moments", 0.0, 1.0)
    step = res.details["precision"]
    assert step <= 1e-7 and res.protocol == "ckks"
    assert res.survivors == (0, 1, 2) and res.weight_sum == pytest.approx(1.0) and sites.live == {0, 1, 2}
    assert res.total.shape == (6,)
    assert np.max(np.abs(res.total - _expected(arrays, w, (0, 1, 2), 1.0))) < release_error_bound(step)
    assert res.details["decryptor"] == 0 and res.details["verify"] == "recompute"
    assert res.details["params"]["poly_modulus_degree"] == 4096
    # the round is over: no site keeps a client machine (nor the secret context) in its state
    assert all("ckks_client" not in st and "ckks_spec" not in st for st in ex.states.values())
    assert (tmp_path / "out" / "progress.jsonl").exists()


@pytest.mark.parametrize("site,k,survivors,decryptor", [
    (0, 3, (0, 1, 2), 1),   # key holder confirmed U, then silent when asked to decrypt: the next site decrypts
    (0, 2, (0, 1, 2), 1),   # key holder silent from the survivor-set confirmation on: same
    (2, 1, (0, 1), 0),      # a site silent at the handoff: left out of the sum
    (1, 0, (0, 2), 0),      # a site silent from the start
])
def test_dropouts_over_flower(arrays, tmp_path, site, k, survivors, decryptor):
    ex = MemoryExchange(arrays, drop={site: k})
    sites = _sites(ex)
    w = np.ones(3)
    res = server_ckks_sum(ex, _cfg(tmp_path), sites, dict(TASK), w, "moments", 0.0, 1.0)
    assert res.survivors == survivors and res.details["decryptor"] == decryptor
    assert np.max(np.abs(res.total - _expected(arrays, w, survivors, 1.0))) < release_error_bound(res.details["precision"])
    assert sites.live == set(survivors)


def test_key_holder_dropping_at_handoff_aborts_and_a_dead_key_holder_is_replaced(arrays, tmp_path):
    ex = MemoryExchange(arrays, drop={0: 1})
    with pytest.raises(ProtocolAbortedError, match="key holder"):
        server_ckks_sum(ex, _cfg(tmp_path), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, 1.0)
    assert ("ckks_client" not in ex.states[1]) and (1, "ckks-end") in ex.seen_ops  # the abort is announced
    # the configured key holder is not live any more: the lowest live site holds the key
    ex = MemoryExchange(arrays)
    sites = _sites(ex)
    sites.live.discard(0)
    res = server_ckks_sum(ex, _cfg(tmp_path, key_holder=0), sites, dict(TASK), np.ones(3), "moments", 0.0, 1.0)
    assert res.details["key_holder"] == 1 and res.survivors == (1, 2)
    assert (0, "ckks-start") not in ex.seen_ops


def test_malicious_server_cannot_get_one_sites_ciphertext_decrypted(arrays, tmp_path):
    """The server swaps the sum in the DecryptRequest for site 1's own upload: every decryptor refuses."""
    from dataclasses import replace

    from securefed.securesum.messages import DecryptRequest, decode, encode, peek_header

    def swap(cid, fields):
        if fields["op"] == "ckks-msgs":
            msgs = []
            for m in fields["msgs"]:
                if peek_header(m)[0] is DecryptRequest:
                    r = decode(m)
                    m = encode(replace(r, chunks=r.uploads[1].chunks))
                msgs.append(m)
            fields["msgs"] = msgs
        return fields

    ex = MemoryExchange(arrays, tamper=swap)
    with pytest.raises(ProtocolAbortedError, match="decrypt"):
        server_ckks_sum(ex, _cfg(tmp_path), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, 1.0)
    assert all("AuthenticationError" in ex.silent[i] and "refused" in ex.silent[i] for i in range(3))
    assert all("ckks_client" not in st for st in ex.states.values())  # aborted machines are forgotten


def test_site_reports_errors_instead_of_crashing(arrays):
    st = SiteState()
    rep = site_handle_ckks({"op": "ckks-msgs", "msgs": [b"junk"]}, arrays[0], st, compute_update)
    assert rep["error"].startswith("ProtocolError") and "no CKKS round" in rep["error"]
    rep = site_handle_ckks({"op": "ckks-start", "spec": b"{bad", "site": 0, "weight": 1.0}, arrays[0], st, compute_update)
    assert rep["error"].startswith("DecodeError")
    assert "unknown CKKS operation" in site_handle_ckks({"op": "nope"}, arrays[0], st, compute_update)["error"]
    # every op the coordinator sends starts with "ckks-" (the site dispatcher routes on that prefix)
    ex = MemoryExchange(arrays)
    server_ckks_sum(ex, SimpleNamespace(), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, 1.0)
    assert {op for _, op in ex.seen_ops} == {"ckks-start", "ckks-msgs", "ckks-end"}


def test_value_bound_is_required(arrays, tmp_path):
    from securefed.errors import ConfigError

    ex = MemoryExchange(arrays)
    with pytest.raises(ConfigError, match="value-bound"):
        server_ckks_sum(ex, _cfg(tmp_path), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, None)


def test_too_few_live_sites_abort_instead_of_releasing_one_update(arrays, tmp_path):
    ex = MemoryExchange(arrays)
    sites = _sites(ex)
    sites.live = {2}
    with pytest.raises(ProtocolAbortedError, match="min-survivors"):
        server_ckks_sum(ex, _cfg(tmp_path), sites, dict(TASK), np.ones(3), "moments", 0.0, 1.0)
    assert ex.messages == 0
    with pytest.raises(ProtocolAbortedError, match="quorum"):  # a single live site cannot form a majority of 3
        server_ckks_sum(ex, _cfg(tmp_path, ckks_min_survivors=1), sites, dict(TASK), np.ones(3), "moments", 0.0, 1.0)
    assert ex.messages == 0
    # the server's opt-in alone is not enough: the site's own floors refuse the weak spec ...
    with pytest.raises(ProtocolAbortedError):
        server_ckks_sum(ex, _cfg(tmp_path, ckks_min_survivors=1, ckks_quorum=1), sites, dict(TASK), np.ones(3),
                        "moments", 0.0, 1.0)
    assert "ckks-min-survivors" in ex.silent[2] and "ckks_client" not in ex.states[2]
    # ... the site's operator must opt in too
    ex = MemoryExchange(arrays, node_config={"ckks-min-survivors": 1, "ckks-allow-minority-quorum": "true"})
    sites = _sites(ex)
    sites.live = {2}
    res = server_ckks_sum(ex, _cfg(tmp_path, ckks_min_survivors=1, ckks_quorum=1), sites, dict(TASK), np.ones(3),
                          "moments", 0.0, 1.0)
    assert res.survivors == (2,)  # an explicit opt-in on both sides


# ------------------------------------------------------------------ the site's floors against a malicious server

def _start_fields(ex, **spec_kw):
    """A ``ckks-start`` for site 1 with a spec the (malicious) server chose."""
    from securefed.securesum.ckks import CKKSRoundSpec, choose_ckks_parameters, encode_ckks_spec

    params = choose_ckks_parameters(6, 1e-6, 3.0, 3)
    kw = dict(session_id=b"x" * 16, round_index=0, n_clients=3, key_holder=0, params=params, clip=1.0,
              identity_keys=tuple(ex.identity(i) for i in range(3)), min_survivors=2, verify="recompute", quorum=0)
    kw.update(spec_kw)
    return dict(TASK, op="ckks-start", site=1, weight=1.0, spec=encode_ckks_spec(CKKSRoundSpec(**kw)))


WEAK = {  # spec change → (node-config key named in the refusal, node config that accepts it)
    "min_survivors=1": (dict(min_survivors=1), "ckks-min-survivors", {"ckks-min-survivors": 1}),
    "quorum=1": (dict(quorum=1), "ckks-allow-minority-quorum", {"ckks-allow-minority-quorum": True}),
    "quorum=1 of 3 (string flag)": (dict(quorum=1), "ckks-allow-minority-quorum", {"ckks-allow-minority-quorum": "yes"}),
    "verify=signatures": (dict(verify="signatures"), "ckks-allow-signature-verify",
                          {"ckks-allow-signature-verify": "true"}),
}


@pytest.mark.parametrize("what", list(WEAK))
def test_site_refuses_a_spec_below_its_floors_and_accepts_with_the_allow_key(arrays, what):
    change, key, allow = WEAK[what]
    ex = MemoryExchange(arrays)
    calls = []

    def counting_update(f, X, g):
        calls.append(1)
        return compute_update(f, X, g)

    for nc in (None, {}, {"ckks-allow-minority-quorum": "false", "ckks-allow-signature-verify": 0}):
        st = SiteState(dict(ex.states[1]))
        rep = site_handle_ckks(_start_fields(ex, **change), arrays[1], st, counting_update, nc)
        assert rep["error"].startswith("ProtocolError") and key in rep["error"] and "refusing" in rep["error"]
        assert "ckks_client" not in st.data and calls == []  # nothing computed, nothing stored, nothing sent
    st = SiteState(dict(ex.states[1]))
    rep = site_handle_ckks(_start_fields(ex, **change), arrays[1], st, counting_update, allow)
    assert "error" not in rep and len(rep["msgs"]) == 1 and "ckks_client" in st.data and calls == [1]
    # the default spec passes the default floors
    st = SiteState(dict(ex.states[1]))
    assert "error" not in site_handle_ckks(_start_fields(ex), arrays[1], st, compute_update)


def test_site_floor_from_distributed_dp_noise_and_bad_node_config(arrays):
    import json

    ex = MemoryExchange(arrays)
    plan = {"noise": "distributed", "min_survivors": None, "sizes": [30, 35, 40]}  # t = all 3 sites
    f = dict(_start_fields(ex, min_survivors=2), dp=json.dumps(plan))
    rep = site_handle_ckks(f, arrays[1], SiteState(dict(ex.states[1])), compute_update)
    assert rep["error"].startswith("ProtocolError") and "t = 3" in rep["error"] and "ckks-min-survivors >= 3" in rep["error"]
    # node-config allow keys do not lower the DP floor
    rep = site_handle_ckks(f, arrays[1], SiteState(dict(ex.states[1])), compute_update, {"ckks-min-survivors": 1})
    assert "t = 3" in rep["error"]
    # an explicit t = 2 in the plan is met by min_survivors = 2 (the check passes; the dp upload itself is
    # the site's DP code's business, so only the floor check is exercised here)
    from securefed.flower.ckks_flow import check_spec_floors, dp_min_survivors
    from securefed.securesum.ckks import decode_ckks_spec

    spec2 = decode_ckks_spec(f["spec"])
    check_spec_floors(spec2, None, json.dumps(dict(plan, min_survivors=2)))
    assert dp_min_survivors(dict(plan, noise="local")) == 0 and dp_min_survivors(None) == 0
    assert dp_min_survivors(json.dumps(plan)) == 3
    for bad in ("abc", 0, -1, 1.5):
        rep = site_handle_ckks(_start_fields(ex), arrays[1], SiteState(), compute_update, {"ckks-min-survivors": bad})
        assert rep["error"].startswith("ConfigError") and "ckks-min-survivors" in rep["error"]


def test_malicious_server_announcing_min_survivors_1_gets_nothing(arrays, tmp_path):
    """The reviewer's attack: a server announces min_survivors = quorum = 1; every site refuses at the start."""
    ex = MemoryExchange(arrays)
    sites = _sites(ex)
    with pytest.raises(ProtocolAbortedError):
        server_ckks_sum(ex, _cfg(tmp_path, ckks_min_survivors=1, ckks_quorum=1), sites, dict(TASK), np.ones(3),
                        "moments", 0.0, 1.0)
    assert all("ckks-min-survivors" in ex.silent[i] for i in range(3))
    assert {op for cid, op in ex.seen_ops if op != "ckks-end"} == {"ckks-start"}  # no upload ever left a site
    assert all("ckks_client" not in st for st in ex.states.values())


def test_server_spec_carries_the_dp_t_under_distributed_noise(arrays, tmp_path):
    from securefed.errors import ConfigError
    from securefed.flower.ckks_flow import ckks_round_spec

    ex = MemoryExchange(arrays)
    sites = _sites(ex)
    dp = dict(epsilon=1.0, noise="distributed")
    assert ckks_round_spec(_cfg(tmp_path, **dp, min_survivors=0), sites, np.ones(3), 6, 1.0).min_survivors == 3
    assert ckks_round_spec(_cfg(tmp_path, **dp, min_survivors=2), sites, np.ones(3), 6, 1.0).min_survivors == 2
    assert ckks_round_spec(_cfg(tmp_path, epsilon=1.0, noise="local"), sites, np.ones(3), 6, 1.0).min_survivors == 2
    assert ckks_round_spec(_cfg(tmp_path, noise="distributed"), sites, np.ones(3), 6, 1.0).min_survivors == 2  # DP off
    with pytest.raises(ConfigError, match="ckks-min-survivors"):
        ckks_round_spec(_cfg(tmp_path, **dp, min_survivors=3, ckks_min_survivors=2), sites, np.ones(3), 6, 1.0)
    sites.live.discard(2)
    with pytest.raises(ProtocolAbortedError, match="DP t = 3"):
        ckks_round_spec(_cfg(tmp_path, **dp), sites, np.ones(3), 6, 1.0)


# ------------------------------------------------------------------------------- clipping and the end of a round

def test_clipped_coordinates_reach_the_result_and_warn(arrays, tmp_path):
    from securefed.securesum.quantize import ClippingWarning

    clip = 0.05
    ups = [compute_update(TASK, X, None) for X in arrays]
    per_site = [int(np.sum(np.abs(u) > clip)) for u in ups]
    assert all(c > 0 for c in per_site) and not all(c == 6 for c in per_site)
    ex = MemoryExchange(arrays)
    with pytest.warns(ClippingWarning, match=f"{sum(per_site)} update coordinates"):
        res = server_ckks_sum(ex, _cfg(tmp_path), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, clip)
    assert res.clipped == sum(per_site) and res.details["clipped_per_site"] == {i: per_site[i] for i in range(3)}
    assert np.max(np.abs(res.total - _expected(arrays, np.ones(3), (0, 1, 2), clip))) < release_error_bound(
        res.details["precision"])
    # a dropped site's clipping is not counted (only the survivors' inputs are in the sum)
    ex = MemoryExchange(arrays, drop={1: 0})
    with pytest.warns(ClippingWarning):
        res = server_ckks_sum(ex, _cfg(tmp_path), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, clip)
    assert res.survivors == (0, 2) and res.clipped == per_site[0] + per_site[2]
    # nothing clipped: 0 and no warning
    import warnings

    ex = MemoryExchange(arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ClippingWarning)
        res = server_ckks_sum(ex, _cfg(tmp_path), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, 100.0)
    assert res.clipped == 0


def test_ckks_end_reaches_a_non_survivor_that_holds_the_secret_context(arrays, tmp_path):
    """Site 2 processes its key handoff (so it holds the secret context) but its upload is lost: it is not
    a survivor, yet it must be told to drop the context."""
    from securefed.securesum.ckks import CKKSClient, decode_ckks_spec

    held = []

    def watch(cid, fields):  # what site 2 holds when the end of the round reaches it
        if cid == 2 and fields["op"] == "ckks-end":
            held.append(CKKSClient.load(ex.states[2]["ckks_client"], decode_ckks_spec(ex.states[2]["ckks_spec"]),
                                        SiteState(dict(ex.states[2])).identity())._ctx.is_private())
        return fields

    ex = MemoryExchange(arrays, lose={2: 1}, tamper=watch)
    res = server_ckks_sum(ex, _cfg(tmp_path), _sites(ex), dict(TASK), np.ones(3), "moments", 0.0, 1.0)
    assert res.survivors == (0, 1) and held == [True]
    assert all("ckks_client" not in st and "ckks_spec" not in st for st in ex.states.values())
