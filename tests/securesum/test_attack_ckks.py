"""Issue 13, attack 5 inverted: CKKS decryption hygiene, and who can read what (computed, not asserted).

Before the fix: a spec with step 2^-60 was accepted and the release carried 31.5 bits of raw
decryption error; precision finer than float64 broke the stated bound 19.7×; the rounding flooded the CKKS
error only to a statistical distance of 2^-7.9 per coordinate; a decryptor's 1.95e278 was accepted as the sum;
and every site received the secret key, so the server plus ANY one site read every upload.
"""

import dataclasses
import math
import os

import numpy as np
import pytest

from securefed.errors import ConfigError, OverflowRiskError
from securefed.federation import SiteWorker
from securefed.securesum import crypto
from securefed.securesum.ckks import (CKKSClient, CKKSRoundSpec, check_ckks_params, choose_ckks_parameters,
                                      decode_ckks_spec, encode_ckks_spec, flood_shift, flood_sigma, gaussian_noise,
                                      release_error_bound, run_ckks_round)
from securefed.securesum.ckks import context as cx
from securefed.securesum.messages import DecryptRequest, SignedInput, decode, encode, peek_header

_KEYS: dict = {}


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def test_a_step_below_the_ckks_error_is_refused_everywhere():
    n, d = 3, 256
    p0 = choose_ckks_parameters(d, 1e-6, float(n), n)
    tiny = dataclasses.replace(p0, step=2.0 ** -60)
    assert any("below 2^6 x the CKKS error" in r for r in check_ckks_params(tiny, n, float(n)))
    with pytest.raises(ConfigError, match="raw decryption noise"):
        CKKSRoundSpec(b"\x01" * 16, 0, n, 0, tiny, 1.0, identities(n)[1])
    good = CKKSRoundSpec(b"\x01" * 16, 0, n, 0, p0, 1.0, identities(n)[1])
    raw = encode_ckks_spec(good).replace(repr(p0.step).encode(), repr(2.0 ** -60).encode())
    with pytest.raises(ConfigError, match="key-recovery risk"):
        decode_ckks_spec(raw)
    # a site answers the server's spec with the reason, before computing anything
    w = SiteWorker({"site-name": "s"}, np.random.default_rng(0).normal(size=(10, 2)))
    rep = w.handle({"op": "ckks-start", "site": 1, "spec": raw, "task": "stats", "want": ["moments"], "scale": 1.0,
                    "weights": "uniform"})
    assert rep["error"].startswith("ConfigError") and "raw decryption noise" in rep["error"]
    assert "ckks_client" not in w.state


def test_precision_beyond_float64_is_refused_with_the_reason():
    n, clip, prec = 3, 1e4, 1e-12
    with pytest.raises(OverflowRiskError, match="cannot be released to .* in float64"):
        choose_ckks_parameters(4096, prec, n * clip, n)
    p = choose_ckks_parameters(4096, 1e-9, n * clip, n)
    fine = dataclasses.replace(p, step=2.0 ** -40)
    assert any("finer than float64" in r for r in check_ckks_params(fine, n, n * clip))


def test_flood_is_sized_for_lambda_bits_and_covers_the_measured_shift():
    """σ = 8·√R·2^(λ/2)·E with E = e_max + 2 ulp(M) ≥ the measured raw error; per-coordinate TV = E/(2σ)."""
    n, d = 10, 4096
    M = float(n)
    params = choose_ckks_parameters(d, 1e-6, M, n)
    ctx = cx.make_context(params)
    rng = np.random.default_rng(2)
    xs = [rng.uniform(-1, 1, d) for _ in range(n)]
    total = cx.sum_ciphertexts(ctx, [cx.encrypt_vector(ctx, x, params.slots) for x in xs])
    raw = cx.decrypt_vectors(cx.vectors(ctx, total, "sum"), d)
    exact = np.array([math.fsum(col) for col in np.array(xs).T])
    E = flood_shift(params.scale_bits, n, M)
    assert float(np.max(np.abs(raw - exact))) <= E  # the shift the flood hides is bounded as stated
    for R in (1, 2, 3):
        sigma = flood_sigma(params.scale_bits, n, M, 40, R)
        assert sigma == pytest.approx(8 * math.sqrt(R) * 2**20 * E)
        assert math.log2(E / (2 * sigma)) == pytest.approx(-(4 + math.log2(R) / 2 + 20))  # 2^-24.5 at R = 2
    sigma = flood_sigma(params.scale_bits, n, M, 40, 2)
    assert 1e-9 < sigma < params.step / 10  # the flood costs less than the rounding at the default precision
    z = gaussian_noise(200_000, 1.0)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01  # the CSPRNG Gaussian
    bound = release_error_bound(params.step, sigma, d)
    assert bound == pytest.approx(params.step * (1 + 2**-6) + math.sqrt(2 * math.log(2 * d * 2.0**40)) * sigma)


def test_a_decryptor_releasing_an_impossible_sum_is_blamed_and_the_fallback_decrypts():
    class Liar(CKKSClient):
        def _on_decrypt(self, msg):
            m = decode(super()._on_decrypt(msg)[0])
            bogus = np.full(self.spec.params.length, 1.95e278).astype("<f8").tobytes()
            sig = crypto.sign(self._identity, cx.decrypted_payload(self.spec.session_id, self.spec.round_index, self.id,
                                                                   self.spec.digest, m.step, bogus))
            return [encode(dataclasses.replace(m, data=bogus, signature=sig))]

    n, d = 3, 16
    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    priv, pub = identities(n)
    xs = [np.random.default_rng(i).uniform(-1, 1, d) for i in range(n)]
    for fallbacks, completes in (((1,), True), ((), False)):
        spec = CKKSRoundSpec(os.urandom(16), 0, n, 0, params, 1.0, pub, max_abs_sum=float(n), fallbacks=fallbacks)
        clients = [(Liar if i == 0 else CKKSClient)(spec, i, priv[i], xs[i]) for i in range(n)]
        out = run_ckks_round(params, priv, pub, xs, np.ones(n), 1.0, session_id=spec.session_id, max_abs_sum=float(n),
                             fallbacks=fallbacks, clients=clients)
        assert out.blame == (0,) and any("lies outside |sum|" in r for r in out.rejected), out.rejected
        if completes:
            assert out.error is None and out.decryptor == 1
            assert np.max(np.abs(out.total - np.sum(xs, axis=0))) < 3 * params.step
        else:
            assert out.total is None and "no client holding the CKKS key" in str(out.error)


def test_who_can_read_an_upload_with_the_server():
    """The statement in docs/threat-model-secure-sum.md, measured: with every upload the server holds, the key
    holder and the fallback decrypt each site's individual update (float64 precision); any other site holds a
    public context that decrypts nothing, and so does the server."""
    n, d = 4, 64
    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    priv, pub = identities(n)
    xs = [np.random.default_rng(10 + i).uniform(-1, 1, d) for i in range(n)]
    spec = CKKSRoundSpec(os.urandom(16), 0, n, 0, params, 1.0, pub, max_abs_sum=float(n))
    clients = [CKKSClient(spec, i, priv[i], xs[i]) for i in range(n)]
    uploads, held = {}, {}

    def watch(direction, who, data):
        cls = peek_header(data)[0]
        if direction == "up" and cls is SignedInput:
            uploads[who] = decode(data).chunks
        if direction == "down" and cls is DecryptRequest and not held:  # every client still holds its context
            held.update({i: c._ctx for i, c in enumerate(clients)})
        return [data]

    out = run_ckks_round(params, priv, pub, xs, np.ones(n), 1.0, session_id=spec.session_id, max_abs_sum=float(n),
                         clients=clients, intercept=watch)
    assert out.error is None and spec.decryptors == (0, 1)
    reads = {}
    for site, ctx in held.items():
        errs = []
        for victim in range(n):
            try:
                got = cx.decrypt_vectors(cx.vectors(ctx, uploads[victim], "upload"), d)
                errs.append(float(np.max(np.abs(got - xs[victim]))))
            except ValueError:
                errs.append(None)
        reads[site] = errs
    assert all(e is not None and e < 1e-12 for s in (0, 1) for e in reads[s])  # key holder, fallback: everything
    assert all(e is None for s in (2, 3) for e in reads[s])  # the other sites: nothing
    assert all(not c.is_private() for s, c in held.items() if s >= 2)
