"""Late-bound input and verifiable aggregates (issues 24 item 2 and 26 item 1): their cost beside the round itself.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/protocols_secagg_proof.py   # N = 10, 50, 100; d = 1e3, 1e5
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/protocols_secagg_proof.py --clients 10 --lengths 1000   # quick
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python benchmarks/protocols_secagg_proof.py --clients 10 50 100 \
        --lengths 100000 --dropouts 0 0.1 --repeats 1 --flower   # with Flower's SecAgg+ (BENCHMARKS.md §11a′)

For every configuration (N clients, vector length d, no dropout or 10 % of the clients dropping after the share
stage — the server must then remove their pairwise masks), one SecAgg+ round runs in process (every client and
the server on this machine, so the round time is all parties' CPU work, serialised) in each schedule:

* **construction** — the input known when the machines are built, every stage signed over the full spec;
* **late** — advertise and share signed over the setup part, the input part bound after the share stage, the
  survivor set sent with every member's signed input binding (the extra bytes and verifications measured here).

After the late round, the server's sum proof is built (``SecAggServer.proof``) and checked by one survivor
(``SecAggClient.verify_sum``): its bytes (what every survivor downloads) and its check time are printed beside the
round's. Masks and keys come from the OS (``os.urandom``); inputs are seeded. The two schedules run interleaved
``--repeats`` times (the medians are printed: the machine is shared). Prints one table and the JSON rows.

``--flower`` adds a third schedule to every repeat (issue 26 item 1: against Flower's own SecAgg+ in the same run):

* **flower** — Flower 1.41's real ``SecAggPlusWorkflow`` and ``secaggplus_mod`` driven by the in-memory grid of
  ``benchmarks/protocols_flower.py`` (``run_flower``: no network, no serialisation, so a lower bound), one round in
  a fresh subprocess (flwr's imports, global RNG seeding and thread pools stay out of this process), the same
  inputs, ``num_shares = k + 1`` (Flower counts the client itself) and securefed's threshold ``t`` at that N; the
  same clients drop, after the share-keys stage (the grid delivers nothing to them from the collect-masked-vectors
  stage on, so Flower's server rebuilds their pairwise masks). Its unmasked sum is checked against the plain sum
  of the survivors' vectors within Flower's quantisation (|U| steps of its grid), the round fails otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from securefed.securesum import crypto
from securefed.securesum.graph import choose_parameters
from securefed.securesum.machine import drive_round
from securefed.securesum.messages import BoundConsistencyRequest, peek_header
from securefed.securesum.quantize import dequantize, plan_fixed_point
from securefed.securesum.runner import MESSAGE_STAGE
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, STAGES, RoundSpec
from securefed.securesum.secagg_client import SecAggClient
from securefed.securesum.secagg_server import SecAggServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def flower_round(n: int, d: int, dropout: float, seed: int) -> dict:
    """One Flower SecAgg+ round in a fresh subprocess (``--flower-worker``), checked and turned into a row."""
    gp = choose_parameters(n)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--flower-worker",
        "--clients",
        str(n),
        "--lengths",
        str(d),
        "--dropouts",
        str(dropout),
        "--seed",
        str(seed),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"Flower round N={n} d={d} dropout={dropout} failed:\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["num_shares"] == gp.degree + 1 and r["threshold"] == gp.threshold
    assert r["max_abs_error_of_sum"] <= r["error_bound_of_sum"], r  # Flower's sum is the survivors' sum
    return {
        "clients": n,
        "length": d,
        "dropout": dropout,
        "schedule": "flower",
        "survivors": r["survivors"],
        "num_shares": r["num_shares"],
        "threshold": r["threshold"],
        "round_seconds": round(r["seconds"], 3),
        "max_abs_error": r["max_abs_error_of_sum"],
        "error_bound": r["error_bound_of_sum"],
        "error_vs_all_n": r["max_abs_error_vs_all_n"],
        "delivered": r["delivered"],
    }


def flower_worker(n: int, d: int, dropout: float, seed: int) -> None:
    """The subprocess side: ``run_flower`` of benchmarks/protocols_flower.py at securefed's default (k, t)."""
    sys.path.insert(0, HERE)
    from protocols_flower import run_flower

    gp = choose_parameters(n)
    print(json.dumps(run_flower(n, d, gp.degree + 1, gp.threshold, seed, dropout=dropout)))


def one(n: int, d: int, dropout: float, seed: int, repeats: int, flower: bool = False) -> list[dict]:
    gp = choose_parameters(n)
    keys = [crypto.ed25519_keypair() for _ in range(n)]
    priv, pub = [k for k, _ in keys], tuple(p for _, p in keys)
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(-1, 1, d) for _ in range(n)]
    fp = plan_fixed_point(1.0, np.ones(n), modulus_bits=32)
    drops = {i: "masked" for i in range(n - round(dropout * n), n)}
    rows = []
    schedules = ("construction", "late", "flower") if flower else ("construction", "late")
    for schedule in schedules * repeats:  # interleaved: the load of a shared machine hits every schedule
        if schedule == "flower":
            rows.append(flower_round(n, d, dropout, seed))
            continue
        sid = os.urandom(16)
        spec = RoundSpec(
            sid, 0, n, gp.degree, gp.threshold, sid, d, fp, pub, tuple(DEFAULT_TIMEOUTS.items()), gp.quorum
        )
        clients = [
            SecAggClient(spec, i, priv[i], xs[i], 1.0, np.random.default_rng([seed, i]), schedule=schedule)
            for i in range(n)
        ]
        server = SecAggServer(spec, schedule=schedule)
        bound = {"bytes": 0, "count": 0}

        def watch(direction, who, data, bound=bound):
            if direction == "down" and peek_header(data)[0] is BoundConsistencyRequest:
                bound["bytes"] += len(data)
                bound["count"] += 1
            return [data]

        t0 = time.perf_counter()
        out = drive_round(server, clients, MESSAGE_STAGE, STAGES, drop_at=drops, intercept=watch)
        wall = time.perf_counter() - t0
        assert out.error is None, out.error
        err = float(np.max(np.abs(dequantize(out.result, fp) - np.sum([xs[u] for u in out.survivors], axis=0))))
        senders = [i for i in range(n) if out.bytes_up[i]]
        row = {
            "clients": n,
            "length": d,
            "dropout": dropout,
            "schedule": schedule,
            "survivors": len(out.survivors),
            "degree": gp.degree,
            "threshold": gp.threshold,
            "quorum": gp.quorum,
            "round_seconds": round(wall, 3),
            "bytes_up_per_client": int(np.mean([out.bytes_up[i] for i in senders])),
            "bytes_down_per_client": int(np.mean(list(out.bytes_down.values()))),
            "binding_bytes_per_signer": int(bound["bytes"] / bound["count"]) if bound["count"] else 0,
            "max_abs_error": err,
        }
        if schedule == "late":
            t0 = time.perf_counter()
            proof = server.proof()
            row["proof_build_seconds"] = round(time.perf_counter() - t0, 4)
            row["proof_bytes"] = len(proof)
            verifier = out.survivors[0]
            t0 = time.perf_counter()
            words = clients[verifier].verify_sum(proof)
            row["verify_seconds"] = round(time.perf_counter() - t0, 4)
            assert np.array_equal(words, out.result)
            row["proof_bytes_per_masked_input"] = round(len(proof) / (d * 4), 2)
        rows.append(row)
    return rows


def median_row(rows: list[dict], schedule: str) -> dict:
    """The median of each timing over the repeats of one schedule (bytes are identical between repeats)."""
    mine = [r for r in rows if r["schedule"] == schedule]
    out = dict(mine[0], repeats=len(mine))
    for k in ("round_seconds", "proof_build_seconds", "verify_seconds"):
        if k in out:
            out[k] = round(float(np.median([r[k] for r in mine])), 4)
            out[k + "_all"] = [r[k] for r in mine]
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


def table_row(c: dict, lt: dict, fl: dict | None) -> str:
    n, d, p = c["clients"], c["length"], c["dropout"]
    cells = [
        n,
        d,
        f"{p:.0%}",
        lt["survivors"],
        c["round_seconds"],
        lt["round_seconds"],
        f"{lt['round_seconds'] / c['round_seconds']:.2f}",
        lt["binding_bytes_per_signer"],
        f"{lt['proof_bytes'] / 1e6:.3f}",
        lt["proof_build_seconds"],
        lt["verify_seconds"],
        f"{lt['verify_seconds'] / lt['round_seconds']:.2f}",
    ]
    if fl is not None:
        assert fl["survivors"] == lt["survivors"]
        cells += [
            fl["round_seconds"],
            f"{fl['round_seconds'] / c['round_seconds']:.2f}",
            f"{fl['round_seconds'] / lt['round_seconds']:.2f}",
            f"{fl['max_abs_error']:.1e}",
        ]
    return "| " + " | ".join(str(x) for x in cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, nargs="*", default=[10, 50, 100])
    ap.add_argument("--lengths", type=int, nargs="*", default=[1000, 100_000])
    ap.add_argument("--dropouts", type=float, nargs="*", default=[0.0, 0.1])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--flower",
        action="store_true",
        help="also run Flower's own SecAgg+ (flwr 1.41, benchmarks/protocols_flower.py) in every repeat, "
        "same inputs, dropouts and (k + 1, t), one subprocess per round",
    )
    ap.add_argument("--flower-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flower_worker:
        flower_worker(args.clients[0], args.lengths[0], args.dropouts[0], args.seed)
        return
    info = machine()
    print(
        f"# {info['date']}  {info['cpu']} ({info['cores']} cores, load {info['load_average']})  Python "
        f"{info['python']}  commit {info['commit']}"
    )
    print(f"# {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    head: tuple[str, ...] = (
        "N",
        "d",
        "drop",
        "surv",
        "round s (constr.)",
        "round s (late)",
        "late/constr.",
        "bindings B/signer",
        "proof MB/site",
        "proof build s",
        "verify s/site",
        "verify/round",
    )
    if args.flower:
        head += ("round s (Flower)", "Flower/constr.", "Flower/late", "Flower sum max abs err")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    rows = []
    for n in args.clients:
        for d in args.lengths:
            for p in args.dropouts:
                runs = one(n, d, p, args.seed, args.repeats, args.flower)
                c, lt = median_row(runs, "construction"), median_row(runs, "late")
                fl = median_row(runs, "flower") if args.flower else None
                rows += [c, lt] + ([fl] if fl else [])
                print(table_row(c, lt, fl), flush=True)
    info["load_average_end"] = [round(x, 1) for x in os.getloadavg()]
    print(f"# load at the end {info['load_average_end']}")
    print(json.dumps({"machine": info, "rows": rows}))


if __name__ == "__main__":
    main()
