"""Issue 25 item 6: a site that breaks a round is named where that is possible, and never causes a silent wrong sum.

Reproduced first: one site that signs a masked input carrying garbage under honest-looking words (every 32-bit
word is a valid encoding) makes every round abort — 6 / 6 rounds, "sum withheld" — and no site can be named:
opening a masked input would expose an honest site's input. What changed: that failure now says so and lists the
sites that could be responsible (``suspects``: the survivors). What *is* identifiable is named and costs only
the offender: a signed masked input whose words no honest encoder produces (≥ 2^k for k < 32, or the wrong
length or word size) convicts its signer (``blame``), is discarded, and the round completes without it with the
exact sum over the others; a seed other than the committed one was already named (test_attack_integrity.py).
A relay that mangles a site's message breaks its signature and names nobody.
"""

import dataclasses
import os

import numpy as np
import pytest

from securefed.securesum import crypto
from securefed.securesum.graph import choose_parameters
from securefed.securesum.messages import MaskedInput, decode, encode, peek_header
from securefed.securesum.quantize import dequantize, plan_fixed_point
from securefed.securesum.runner import run_secagg_round
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, RoundSpec, bound_masked_payload, input_hash, masked_payload
from securefed.securesum.secagg_client import SecAggClient

_KEYS: dict = {}
OFFENDER = 2


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


class _Resigned(SecAggClient):
    """Masks honestly, then changes its masked vector and signs the result with its own key."""

    def change(self, data: bytes) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    def _mask(self):
        m = decode(super()._mask()[0])
        spec = self.spec
        data = self.change(m.data)
        self._input_hash = input_hash(data, m.peers)
        if self.schedule == "construction":
            payload = masked_payload(spec.session_id, spec.round_index, spec.digest, self.id, m.bits, data, m.peers)
        else:
            payload = bound_masked_payload(
                spec.session_id, spec.round_index, spec.digest, self.id, m.bits, self._input_hash
            )
        return [encode(dataclasses.replace(m, data=data, signature=crypto.sign(self._identity, payload)))]


class _GarbageUnderneath(_Resigned):
    """Valid-looking words (uniform mod 2^k, as every masked input), garbage underneath: y + G unmasks to q + G."""

    def change(self, data):
        k = self.spec.fixed_point.modulus_bits
        g = np.frombuffer(os.urandom(len(data)), dtype=self.spec.fixed_point.dtype) & np.uint32((1 << k) - 1)
        out = np.frombuffer(data, dtype=self.spec.fixed_point.dtype) + g
        return (out & np.uint32((1 << k) - 1) if k < 32 else out).tobytes()


class _HighWords(_Resigned):
    """Sets bit 30 of some words of a 24-bit round: words no honest encoder produces (they are reduced mod 2^k)."""

    def change(self, data):
        w = np.frombuffer(data, dtype=np.uint32).copy()
        w[::3] |= np.uint32(1 << 30)
        return w.tobytes()


class _WrongLength(_Resigned):
    def change(self, data):
        return data + data[:4]


def make(n, d=8, bits=32, seed=0):
    gp = choose_parameters(n)
    sid = os.urandom(16)
    fp = plan_fixed_point(100.0, np.ones(n), modulus_bits=bits, fractional_bits=2)
    spec = RoundSpec(
        sid, seed, n, gp.degree, gp.threshold, sid, d, fp, identities(n)[1], tuple(DEFAULT_TIMEOUTS.items()), gp.quorum
    )
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-400, 400, d) / 4 for _ in range(n)]
    return spec, xs, rng


def run(spec, xs, rng, bad=None, intercept=None):
    n = spec.n_clients
    clients = [
        (bad if (bad is not None and i == OFFENDER) else SecAggClient)(spec, i, identities(n)[0][i], xs[i], 1.0, rng)
        for i in range(n)
    ]
    return run_secagg_round(spec, identities(n)[0], xs, np.ones(n), rng, clients=clients, intercept=intercept)


@pytest.mark.usefixtures("schedule")
def test_garbage_under_honest_words_aborts_every_round_fail_closed_and_names_the_suspects():
    n = 6
    for r in range(6):
        spec, xs, rng = make(n, seed=r)
        out = run(spec, xs, rng, _GarbageUnderneath)
        assert out.aborted and out.result is None and "sum withheld" in str(out.error)  # no silent wrong sum
        assert out.blame == ()  # not identifiable: named as such, not guessed
        assert out.suspects == tuple(range(n)) and OFFENDER in out.suspects
        assert "not identifiable" in str(out.error) and str(list(range(n))) in str(out.error)
    # control: the same rounds without the offender complete exactly
    spec, xs, rng = make(n, seed=9)
    out = run(spec, xs, rng)
    assert (
        out.error is None
        and out.suspects == ()
        and np.array_equal(dequantize(out.result, spec.fixed_point), np.sum(xs, axis=0))
    )


@pytest.mark.usefixtures("schedule")
@pytest.mark.parametrize("bad,bits", [(_HighWords, 24), (_WrongLength, 32), (_WrongLength, 24)])
def test_a_signed_input_no_encoder_produces_names_its_signer_and_costs_only_it(bad, bits):
    n = 6
    for r in range(3):
        spec, xs, rng = make(n, bits=bits, seed=r)
        out = run(spec, xs, rng, bad)
        assert out.error is None and out.blame == (OFFENDER,) and OFFENDER not in out.survivors
        assert out.survivors == tuple(i for i in range(n) if i != OFFENDER)
        np.testing.assert_array_equal(
            dequantize(out.result, spec.fixed_point), np.sum([xs[u] for u in out.survivors], axis=0)
        )
        assert any(f"client {OFFENDER} signed a masked input" in r for r in out.rejected)


def test_a_relay_that_mangles_a_masked_input_names_nobody():
    n = 6
    spec, xs, rng = make(n, bits=24)

    def mangle(direction, who, data):
        if direction == "up" and who == OFFENDER and peek_header(data)[0] is MaskedInput:
            m = decode(data)
            w = np.frombuffer(m.data, dtype=np.uint32).copy()
            w[0] |= np.uint32(1 << 30)  # what _HighWords signs, but unsigned: the relay's doing
            return [encode(dataclasses.replace(m, data=w.tobytes()))]
        return [data]

    out = run(spec, xs, rng, intercept=mangle)
    assert out.error is None and out.blame == () and OFFENDER not in out.survivors
    assert any("signature" in r for r in out.rejected)


def test_a_named_client_is_refused_from_then_on_and_the_stage_does_not_wait_for_it():
    from securefed.securesum.secagg_server import SecAggServer

    n = 5
    spec, xs, rng = make(n, bits=24)
    priv = identities(n)[0]
    clients = [(_HighWords if i == OFFENDER else SecAggClient)(spec, i, priv[i], xs[i], 1.0, rng) for i in range(n)]
    server = SecAggServer(spec)
    out = []
    for c in clients:
        out += server.receive(c.start()[0])
    out = [r for rid, data in out for m in clients[rid].receive(data) for r in server.receive(m)]  # share stage
    masked = {rid: clients[rid].receive(data)[0] for rid, data in out}
    assert server.stage == "masked"
    server.receive(masked[OFFENDER])
    assert server.blame == (OFFENDER,)
    # the offender repairs its vector and signs again: refused, it was named
    m = decode(masked[OFFENDER])
    fixed = (np.frombuffer(m.data, dtype=np.uint32) & np.uint32((1 << 24) - 1)).tobytes()
    sig = crypto.sign(priv[OFFENDER], masked_payload(spec.session_id, 0, spec.digest, OFFENDER, 24, fixed, m.peers))
    assert server.receive(encode(dataclasses.replace(m, data=fixed, signature=sig))) == []
    assert "named" in str(server.rejected[-1][1])
    replies = [r for u in range(n) if u != OFFENDER for r in server.receive(masked[u])]
    assert server.stage == "consistency" and len(replies) == n - 1  # closed at once: no wait for the named client
    assert server.dropped_at["masked"] == (OFFENDER,)
