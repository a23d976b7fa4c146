"""CKKS secure sum over the Flower logic without Flower: ``server_ckks_sum`` + ``site_handle_ckks``.

Every site request is answered by ``site_handle_ckks`` with a fresh ``SiteState`` rebuilt from the
stored bytes (as a fresh ClientApp process would), so the CKKS client machine — and the TenSEAL secret
context on key-holding sites — must survive the store/load between messages.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from securefed.errors import ProtocolAbortedError
from securefed.protocols.ckks import release_error_bound
from securefed.protocols.flower.ckks_flow import server_ckks_sum, site_handle_ckks
from securefed.protocols.flower.site import SiteState, compute_update
from securefed.protocols.flower.transport import payload_size


class MemoryExchange:
    """The ``Exchange`` interface, delivered in process to ``site_handle_ckks``.

    ``drop={site: k}`` makes a site silent from its k-th request on (0 = ckks-start), like a crashed
    SuperNode; ``tamper(cid, fields)`` may rewrite a request before delivery (a malicious server).
    """

    def __init__(self, arrays, drop=None, tamper=None):
        self.arrays = arrays
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
        from securefed.protocols import crypto
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
            rep = site_handle_ckks(dict(fields), self.arrays[cid], st, compute_update)
            self.states[cid] = dict(st.data)
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

    from securefed.protocols.messages import DecryptRequest, decode, encode, peek_header

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
    res = server_ckks_sum(ex, _cfg(tmp_path, ckks_min_survivors=1, ckks_quorum=1), sites, dict(TASK), np.ones(3),
                          "moments", 0.0, 1.0)
    assert res.survivors == (2,)  # an explicit opt-in
