"""SecAgg+ with integer inputs mod 2^k (the input path of the distributed discrete Gaussian / Skellam): no
fixed-point codec, no clipping, wrap-around mod 2^k, and a spec that encodes the fixed-point path unchanged."""

import os

import numpy as np
import pytest

from securefed.errors import ConfigError, DataError
from securefed.securesum import crypto
from securefed.securesum.quantize import integer_plan, plan_fixed_point
from securefed.securesum.runner import run_secagg_round
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, RoundSpec, SecAggClient, decode_spec, encode_spec


def _spec(n, bits, length, integer=True):
    keys = [crypto.ed25519_keypair() for _ in range(n)]
    sid = os.urandom(16)
    fp = integer_plan(bits, n) if integer else plan_fixed_point(1.0, np.ones(n), modulus_bits=bits)
    spec = RoundSpec(
        sid,
        0,
        n,
        n - 1,
        n // 2 + 1,
        sid,
        length,
        fp,
        tuple(p for _, p in keys),
        tuple(DEFAULT_TIMEOUTS.items()),
        0,
        integer,
    )
    return spec, [k for k, _ in keys]


@pytest.mark.parametrize("bits", [16, 24, 32, 48, 64])
def test_integer_inputs_sum_mod_2k_exactly_including_wraparound(bits):
    n, d = 4, 33
    spec, sks = _spec(n, bits, d)
    rng = np.random.default_rng(bits)
    m = 1 << bits
    ups = [rng.integers(0, m, size=d, dtype=np.uint64) for _ in range(n)]
    for u in ups:
        u[:3] = np.uint64(m - 1)  # large words: their sum wraps around 2^k
    out = run_secagg_round(spec, sks, ups, [1.0] * n, rng)
    want = [sum(int(u[j]) for u in ups) % m for j in range(d)]
    assert out.result is not None
    assert out.error is None and out.survivors == tuple(range(n))
    assert [int(v) for v in out.result] == want


def test_integer_spec_round_trips_and_fixed_point_spec_bytes_unchanged():
    spec, _ = _spec(3, 20, 8)
    assert decode_spec(encode_spec(spec)).integer is True
    assert b'"input": "integer"' in encode_spec(spec)
    fspec, _ = _spec(3, 32, 8, integer=False)
    assert b"input" not in encode_spec(fspec) and decode_spec(encode_spec(fspec)).integer is False


def test_integer_client_refuses_floats_out_of_range_values_and_weights():
    spec, sks = _spec(3, 16, 4)
    with pytest.raises(DataError, match="unsigned integers"):
        SecAggClient(spec, 0, sks[0], np.zeros(4), 1.0)
    with pytest.raises(DataError, match="mod 2"):
        SecAggClient(spec, 0, sks[0], np.full(4, 1 << 16, dtype=np.uint64), 1.0)
    with pytest.raises(ConfigError, match="weight"):
        SecAggClient(spec, 0, sks[0], np.zeros(4, dtype=np.uint64), 3.0)
    with pytest.raises(ConfigError, match="16, 64"):
        integer_plan(8, 3)
