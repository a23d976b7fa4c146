"""Naming the site that breaks a SecAgg+ round (issue 25 item 6): what is identified, what it costs, and what a sound
identifying check for the rest would cost if built here.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/protocols_secagg_blame.py

Three parts, in one run:

1. **The attack and the outcome.** 6 rounds (N = 6, d = 1 000) with one site signing garbage under honest-looking
   masked words: every round aborts, fail closed, with the survivors named as suspects (not identifiable); 6 rounds
   with one site signing words no honest encoder produces (≥ 2^24 in a 24-bit round): every round completes without
   it, the site named. Round times beside an honest round.
2. **The cost of the identifiable checks**: the server's extra pass over each masked input (words ≥ 2^k), against
   the signature check it already does (hash + Ed25519), at d = 10³ and 10⁵.
3. **The cost of a sound check for the un-identifiable case**, measured on its building block: an ACORN-style
   design commits to every coordinate of the input (Pedersen, g^m·h^r in a 2048-bit Schnorr group with a 256-bit
   prime order — Python integers, the only big-number arithmetic available here besides ``cryptography``'s
   fixed-purpose primitives) and proves each coordinate in range bit by bit (a Cramer–Damgård–Schoenmakers OR proof
   that a commitment opens to 0 or 1, Fiat–Shamir). Prove and verify one bit are timed; the totals for
   d coordinates of b bits are extrapolated (d·b bit proofs, plus the link of the commitments to the masked input,
   which is not even counted).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import secrets
import subprocess
import time

import numpy as np

from securefed.securesum import crypto
from securefed.securesum.graph import choose_parameters
from securefed.securesum.messages import decode, encode
from securefed.securesum.quantize import plan_fixed_point
from securefed.securesum.runner import run_secagg_round
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, RoundSpec, masked_payload
from securefed.securesum.secagg_client import SecAggClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------- 1. the attack


def _resigned(change):
    class Resigned(SecAggClient):
        def _mask(self):
            import dataclasses

            m = decode(super()._mask()[0])
            data = change(self, m.data)
            spec = self.spec
            sig = crypto.sign(
                self._identity,
                masked_payload(spec.session_id, spec.round_index, spec.digest, self.id, m.bits, data, m.peers),
            )
            return [encode(dataclasses.replace(m, data=data, signature=sig))]

    return Resigned


def _garbage(client, data):
    k = client.spec.fixed_point.modulus_bits
    g = np.frombuffer(os.urandom(len(data)), dtype=np.uint32)
    out = np.frombuffer(data, dtype=np.uint32) + g
    return (out & np.uint32((1 << k) - 1) if k < 32 else out).tobytes()


def _high_words(client, data):
    w = np.frombuffer(data, dtype=np.uint32).copy()
    w[::3] |= np.uint32(1 << 30)
    return w.tobytes()


def attack(rounds: int = 6, n: int = 6, d: int = 1000) -> dict:
    keys = [crypto.ed25519_keypair() for _ in range(n)]
    priv, pub = [k for k, _ in keys], tuple(p for _, p in keys)
    gp = choose_parameters(n)
    out = {}
    for name, bits, cls in (
        ("honest", 32, None),
        ("garbage under honest words", 32, _resigned(_garbage)),
        ("words >= 2^k (k = 24)", 24, _resigned(_high_words)),
    ):
        results: list[dict] = []
        times: list[float] = []
        for r in range(rounds):
            sid = os.urandom(16)
            fp = plan_fixed_point(1.0, np.ones(n), modulus_bits=bits)
            spec = RoundSpec(
                sid, r, n, gp.degree, gp.threshold, sid, d, fp, pub, tuple(DEFAULT_TIMEOUTS.items()), gp.quorum
            )
            rng = np.random.default_rng(r)
            xs = [rng.uniform(-1, 1, d) for _ in range(n)]
            clients = [
                (cls if (cls is not None and i == 2) else SecAggClient)(spec, i, priv[i], xs[i], 1.0, rng)
                for i in range(n)
            ]
            t0 = time.perf_counter()
            o = run_secagg_round(spec, priv, xs, np.ones(n), rng, clients=clients)
            times.append(time.perf_counter() - t0)
            results.append(
                {
                    "aborted": o.aborted,
                    "blame": list(o.blame),
                    "suspects": list(o.suspects),
                    "survivors": list(o.survivors),
                }
            )
        out[name] = {
            "rounds": rounds,
            "aborted": sum(x["aborted"] for x in results),
            "named": sorted({b for x in results for b in x["blame"]}),
            "suspects": results[-1]["suspects"],
            "survivors_last": results[-1]["survivors"],
            "round_seconds_median": round(float(np.median(times)), 4),
        }
    return out


# ------------------------------------------------------------------------- 2. the identifiable checks


def checks(lengths=(1000, 100_000), repeats: int = 50) -> list[dict]:
    sk, pk = crypto.ed25519_keypair()
    rows = []
    for d in lengths:
        words = np.frombuffer(os.urandom(4 * d), dtype=np.uint32) & np.uint32((1 << 24) - 1)
        data = words.tobytes()
        peers = tuple(range(9))
        sid = os.urandom(16)
        sig = crypto.sign(sk, masked_payload(sid, 0, bytes(32), 1, 24, data, peers))
        t0 = time.perf_counter()
        for _ in range(repeats):
            crypto.verify(pk, sig, masked_payload(sid, 0, bytes(32), 1, 24, data, peers), what="bench")
        sign_check = (time.perf_counter() - t0) / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            bool(np.any(np.frombuffer(data, dtype=np.uint32) >> np.uint32(24)))
        word_check = (time.perf_counter() - t0) / repeats
        rows.append(
            {
                "length": d,
                "signature_check_ms": round(1e3 * sign_check, 4),
                "word_check_ms": round(1e3 * word_check, 4),
                "ratio": round(word_check / sign_check, 3),
            }
        )
    return rows


# ---------------------------------------------------------------- 3. a sound check's building block


def _is_probable_prime(n: int, rounds: int = 40) -> bool:
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for _ in range(rounds):
        x = pow(secrets.randbelow(n - 3) + 2, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def schnorr_group(pbits: int = 2048, qbits: int = 256) -> tuple[int, int, int, int]:
    """A prime p = k·q + 1 with a qbits-bit prime q, and two generators g, h of the order-q subgroup (h derived by
    hashing, so nobody knows log_g h)."""
    while True:
        q = secrets.randbits(qbits) | (1 << (qbits - 1)) | 1
        if _is_probable_prime(q):
            break
    while True:
        k = secrets.randbits(pbits - qbits) | (1 << (pbits - qbits - 1))
        k -= k % 2
        p = k * q + 1
        if p.bit_length() == pbits and _is_probable_prime(p):
            break

    def gen(tag: bytes) -> int:
        i = 0
        while True:
            x = int.from_bytes(hashlib.sha512(tag + i.to_bytes(4, "big")).digest() * 5, "big") % p
            g = pow(x, (p - 1) // q, p)
            if g > 1:
                return g
            i += 1

    return p, q, gen(b"securefed/g"), gen(b"securefed/h")


def _hash(q: int, *vals: int) -> int:
    h = hashlib.sha256()
    for v in vals:
        h.update(v.to_bytes((v.bit_length() + 7) // 8 + 1, "big"))
    return int.from_bytes(h.digest(), "big") % q


def prove_bit(grp, m: int, r: int) -> tuple[int, tuple]:
    """Commit C = g^m h^r (m ∈ {0, 1}) and prove, in zero knowledge, that C opens to 0 or to 1 (CDS OR proof)."""
    p, q, g, h = grp
    C = pow(g, m, p) * pow(h, r, p) % p
    Y = (C, C * pow(g, -1, p) % p)  # C = h^r if m = 0, C / g = h^r if m = 1
    real, fake = m, 1 - m
    c_f, z_f = secrets.randbelow(q), secrets.randbelow(q)
    a = [0, 0]
    a[fake] = pow(h, z_f, p) * pow(Y[fake], q - c_f, p) % p
    w = secrets.randbelow(q)
    a[real] = pow(h, w, p)
    c = _hash(q, C, a[0], a[1])
    c_r = (c - c_f) % q
    z_r = (w + c_r * r) % q
    cs, zs = [0, 0], [0, 0]
    cs[real], cs[fake], zs[real], zs[fake] = c_r, c_f, z_r, z_f
    return C, (a[0], a[1], cs[0], cs[1], zs[0], zs[1])


def verify_bit(grp, C: int, proof: tuple) -> bool:
    p, q, g, h = grp
    a0, a1, c0, c1, z0, z1 = proof
    if (c0 + c1) % q != _hash(q, C, a0, a1):
        return False
    Y1 = C * pow(g, -1, p) % p
    return pow(h, z0, p) == a0 * pow(C, c0, p) % p and pow(h, z1, p) == a1 * pow(Y1, c1, p) % p


def sound_check_cost(bits_range: int = 24, samples: int = 40) -> dict:
    t0 = time.perf_counter()
    grp = schnorr_group()
    setup = time.perf_counter() - t0
    p, q, _, _ = grp
    proofs = []
    t0 = time.perf_counter()
    for i in range(samples):
        proofs.append(prove_bit(grp, i % 2, secrets.randbelow(q)))
    prove = (time.perf_counter() - t0) / samples
    t0 = time.perf_counter()
    ok = all(verify_bit(grp, C, pr) for C, pr in proofs)
    verify = (time.perf_counter() - t0) / samples
    assert ok
    C, pr = proofs[0]
    forged = (pr[0], pr[1], pr[2], pr[3], (pr[4] + 1) % q, pr[5])
    assert not verify_bit(grp, C, forged)  # the verifier can fail
    bit_bytes = (p.bit_length() + 7) // 8 * 3 + (q.bit_length() + 7) // 8 * 4  # C, a0, a1 and four scalars
    out = {
        "group": f"{p.bit_length()}-bit p, {q.bit_length()}-bit q",
        "group_setup_seconds": round(setup, 2),
        "prove_ms_per_bit": round(1e3 * prove, 3),
        "verify_ms_per_bit": round(1e3 * verify, 3),
        "bytes_per_bit": bit_bytes,
        "range_bits": bits_range,
    }
    per_input: dict = {}
    for d in (1000, 100_000):
        nb = d * bits_range
        per_input[d] = {
            "prove_seconds": round(nb * prove, 1),
            "verify_seconds_per_input": round(nb * verify, 1),
            "proof_megabytes": round(nb * bit_bytes / 1e6, 1),
        }
    out["per_input"] = per_input
    return out


def machine() -> dict:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": model,
        "cores": os.cpu_count(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "python": platform.python_version(),
        "commit": commit.strip(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    info = machine()
    print(
        f"# {info['date']}  {info['cpu']} ({info['cores']} cores, load {info['load_average']})  Python "
        f"{info['python']}  commit {info['commit']}"
    )
    a = attack(args.rounds)
    print("\n| site 2 sends | rounds | aborted | named (blame) | suspects | survivors | round s (median) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in a.items():
        print(
            f"| {name} | {r['rounds']} | {r['aborted']} | {r['named'] or '–'} | {r['suspects'] or '–'} | "
            f"{r['survivors_last'] or '–'} | {r['round_seconds_median']} |"
        )
    c = checks()
    print("\n| d | signature check ms (already done) | words >= 2^k check ms (new) | new / existing |")
    print("|---|---|---|---|")
    for r in c:
        print(f"| {r['length']} | {r['signature_check_ms']} | {r['word_check_ms']} | {r['ratio']} |")
    s = sound_check_cost()
    print(
        f"\nSound check building block ({s['group']}; group generated in {s['group_setup_seconds']} s): one bit "
        f"commitment + OR proof: prove {s['prove_ms_per_bit']} ms, verify {s['verify_ms_per_bit']} ms, "
        f"{s['bytes_per_bit']} bytes; {s['range_bits']}-bit range per coordinate:"
    )
    print("| d | prove s per site | verify s per input | proof MB per input |")
    print("|---|---|---|---|")
    for d, r in s["per_input"].items():
        print(f"| {d} | {r['prove_seconds']} | {r['verify_seconds_per_input']} | {r['proof_megabytes']} |")
    print(json.dumps({"machine": info, "attack": a, "checks": c, "sound_check": s}))


if __name__ == "__main__":
    main()
