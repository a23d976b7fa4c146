"""Issue 12 item 4: both protocols' machines have one shape — a transition table each, one fail-closed server
base class, one round driver with one result type — and TenSEAL is imported only when CKKS is used."""

import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from securefed.errors import ProtocolAbortedError, SecureFedError
from securefed.securesum import CKKSClient, CKKSServer, SecAggClient, SecAggServer, crypto
from securefed.securesum.ckks import CKKS_STAGES, choose_ckks_parameters, run_ckks_round
from securefed.securesum.ckks.params import CKKSRoundSpec
from securefed.securesum.graph import choose_parameters
from securefed.securesum.machine import RoundOutcome, StageClient, StageServer
from securefed.securesum.quantize import plan_fixed_point
from securefed.securesum.runner import run_secagg_round
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, STAGES, RoundSpec

KEYS = [crypto.ed25519_keypair() for _ in range(5)]
PRIV, PUB = tuple(k for k, _ in KEYS), tuple(p for _, p in KEYS)


def _secagg_spec(n=5):
    gp = choose_parameters(n)
    sid = os.urandom(16)
    fp = plan_fixed_point(10.0, np.ones(n), modulus_bits=32)
    return RoundSpec(
        sid, 0, n, gp.degree, gp.threshold, sid, 4, fp, PUB[:n], tuple(DEFAULT_TIMEOUTS.items()), gp.quorum
    )


def test_transition_tables_and_base_classes():
    for cls in (SecAggServer, CKKSServer):
        assert issubclass(cls, StageServer)
        assert all(
            isinstance(h, dict) and all(hasattr(cls, name) for name in h.values()) for h in cls.TRANSITIONS.values()
        )
    assert set(SecAggServer.TRANSITIONS) == set(STAGES)
    assert set(CKKSServer.TRANSITIONS) == {"advertise", "handoff", "input", "confirm", "decrypt"}
    for cls in (SecAggClient, CKKSClient):
        assert issubclass(cls, StageClient)
        assert all(hasattr(cls, name) for h in cls.TRANSITIONS.values() for name in h.values())


def test_both_runners_return_the_same_result_type():
    xs = [np.ones(4) for _ in range(5)]
    a = run_secagg_round(_secagg_spec(), PRIV, xs, np.ones(5), np.random.default_rng(0))
    params = choose_ckks_parameters(4, 1e-6, 5.0, 5)
    b = run_ckks_round(params, PRIV, PUB, xs, np.ones(5), 1.0)
    assert type(a) is type(b) is RoundOutcome and a.error is None and b.error is None
    assert set(a.timings) == set(STAGES) and set(CKKS_STAGES) <= set(b.timings)
    assert all(set(v) == {"clients", "server"} for v in list(a.timings.values()) + list(b.timings.values()))


def _servers():
    spec = _secagg_spec()
    params = choose_ckks_parameters(4, 1e-6, 5.0, 5)
    cspec = CKKSRoundSpec(os.urandom(16), 0, 5, 0, params, 1.0, PUB, max_abs_sum=5.0)
    advert = SecAggClient(spec, 0, PRIV[0], np.ones(4)).start()[0]
    cadvert = CKKSClient(cspec, 0, PRIV[0], np.ones(4)).start()[0]
    return [(SecAggServer(spec), advert), (CKKSServer(cspec), cadvert)]


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 400), st.integers(0, 255))
def test_fail_closed_an_exception_means_aborted(junk, pos, byte):
    for server, good in _servers():
        for data in (junk, good[: pos % len(good)] + bytes([byte]) + good[pos % len(good) + 1 :]):
            try:
                server.receive(data, 0.0)
            except Exception:
                assert server.stage == "aborted"
            else:
                assert server.stage != "aborted"


def test_an_unexpected_error_in_a_handler_aborts_the_server(monkeypatch):
    (server, advert), _ = _servers()

    def bug(self, msg):
        raise KeyError("a bug, not a refusal")

    monkeypatch.setattr(SecAggServer, "_on_advert", bug)
    with pytest.raises(KeyError):
        server.receive(advert)
    assert server.stage == "aborted" and isinstance(server.error, KeyError)
    assert server.receive(advert) == [] and server.stage == "aborted"  # answers nothing any more


def test_a_refused_message_leaves_the_server_unchanged():
    (server, advert), _ = _servers()
    server.receive(advert)
    before = (server.stage, dict(server.received), server.deadline)
    assert server.receive(advert) == []
    assert (server.stage, dict(server.received), server.deadline) == before
    assert isinstance(server.rejected[-1][1], SecureFedError) and server.rejected[-1][0] == 0
    with pytest.raises(ProtocolAbortedError):
        server.tick(1e9)  # one client of five: the round cannot complete, and says so
    assert server.stage == "aborted"


def test_tenseal_is_imported_only_when_ckks_is_used():
    """No module of securefed.securesum imports TenSEAL at import time (only inside the functions that make or use
    a context), so SecAgg+-only deployments never load it."""
    import ast
    import pathlib

    import securefed.securesum as pkg

    for path in pathlib.Path(pkg.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top for a in n.names] + [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not any(x.split(".")[0] == "tenseal" for x in names), path
