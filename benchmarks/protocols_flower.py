"""Flower SecAgg+ vs securefed SecAgg+ in the same process, at equal degree and threshold.

Run with the interpreter of a separate venv that has flwr (never a project dependency)::

    python3 -m venv /tmp/flwr-venv --system-site-packages && /tmp/flwr-venv/bin/pip install flwr
    OMP_NUM_THREADS=1 /tmp/flwr-venv/bin/python benchmarks/protocols_flower.py --clients 50 --length 100000 --shares 7 --threshold 4

How Flower is driven: its real server workflow (``flwr.server.workflow.SecAggPlusWorkflow``, all four
stages, with ``FedAvg`` aggregating the unmasked sum) and its real client mod
(``flwr.client.mod.secaggplus_mod`` around a ``NumPyClient``) are connected by a minimal in-memory
``Grid`` written here that hands each server message straight to the destination node's
``ClientApp`` and returns the reply — no network, no protobuf serialisation (a deep copy of each
message instead, since Flower's client mod mutates what it receives), no polling sleeps, so the Flower
time measured is a *lower bound* of what a deployment would take. ``--dropout p`` (Flower only): the last
round(p · N) nodes drop after the share-keys stage (``run_flower``'s docstring).

Equal parameters: Flower's ``num_shares = s`` counts the client itself (s − 1 neighbours) and its
threshold counts shares out of those s; securefed is run with ``degree = s − 1`` neighbours and the same
threshold ``t`` out of its ``s − 1`` neighbours (a slightly *harder* reconstruction condition).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
import uuid

import numpy as np


def _local_grid(app, node_ctx: dict, dropped: set, delivered: dict):
    """The in-memory ``Grid``: each message deep-copied and handed to its node's ``ClientApp`` (no network, no
    serialisation); messages of the collect-masked-vectors and unmask stages to a ``dropped`` node are lost (no
    reply), the rest counted per stage in ``delivered``."""
    from flwr.app import Message
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
    from flwr.serverapp.grid import Grid
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity

    late_stages = (Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK)

    class LocalGrid(Grid):
        def __init__(self):
            self._run = Run.create_empty(1)

        def set_run(self, run):
            self._run = run

        @property
        def run(self):
            return self._run

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self):
            return list(node_ctx)

        def push_messages(self, messages):
            raise RuntimeError("this in-memory grid only supports send_and_receive")

        def pull_messages(self, message_ids):
            raise RuntimeError("this in-memory grid only supports send_and_receive")

        def send_and_receive(self, messages, *, timeout=None):
            replies = []
            for msg in messages:
                stage = msg.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]
                if msg.metadata.dst_node_id in dropped and stage in late_stages:
                    continue  # a dropped node: the message is lost, no reply comes back
                delivered[stage] += 1
                # Flower's workflow shares one content object between messages and its client mod
                # mutates the content it receives; a real transport serialises, so copy per delivery
                msg = copy.deepcopy(msg)
                md = msg.metadata
                md.__dict__["_message_id"] = uuid.uuid4().hex
                md.__dict__["_run_id"] = 1
                md.__dict__["_src_node_id"] = 0
                TaskIdentity.node_id = md.dst_node_id  # the client process's identity while it runs
                reply = app(msg, node_ctx[md.dst_node_id])
                TaskIdentity.node_id = 0
                replies.append(reply)
            return replies

    return LocalGrid()


def run_flower(n: int, d: int, shares: int, threshold: int, seed: int = 0, dropout: float = 0.0) -> dict:
    """One Flower SecAgg+ round over ``n`` nodes (ids 1..n) with vectors of length ``d``.

    ``dropout``: the last ``round(dropout * n)`` nodes drop after the share-keys stage — the in-memory grid
    delivers nothing to them from the collect-masked-vectors stage on and returns no reply (what a real
    ``Grid`` returns once the workflow's ``timeout`` has expired — with Flower's default ``timeout=None`` a
    deployment would wait for them forever; the wait is not counted here), so the server must rebuild their
    pairwise masks from
    their neighbours' shares of their key (securefed's ``drop_stage="masked"``). The returned error is
    Flower's unmasked sum (its weighted mean × the survivor count; every weight is 1) against the plain
    sum of the survivors' vectors; ``error_bound_of_sum`` is |U| quantisation steps (stochastic rounding
    moves each value by less than one step of Flower's grid, scaled by its weight factor).
    """
    from flwr.app import Context, RecordDict
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerConfig
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.common import ConfigRecord
    from flwr.common.secure_aggregation.secaggplus_constants import Stage
    import flwr.compat.common.recorddict_compat as compat
    from flwr.supercore.task_identity import TaskIdentity

    logging.getLogger("flwr").setLevel(logging.WARNING)
    rng = np.random.default_rng(seed)
    data = {nid: rng.uniform(-1, 1, d).astype(np.float32) for nid in range(1, n + 1)}
    dropped = set(range(n - round(dropout * n) + 1, n + 1))
    delivered = {stage: 0 for stage in Stage.all()}

    class Client(NumPyClient):
        def __init__(self, nid):
            self.nid = nid

        def fit(self, parameters, config):
            return [data[self.nid]], 1, {}

    app = ClientApp(client_fn=lambda ctx: Client(int(ctx.node_id)).to_client(), mods=[secaggplus_mod])
    node_ctx = {nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={}) for nid in data}

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 0, 0
    grid = _local_grid(app, node_ctx, dropped, delivered)
    cm = SimpleClientManager()
    for nid in data:
        cm.register(GridClientProxy(node_id=nid, grid=grid, run_id=1))
    strategy = FedAvg(
        fraction_fit=1.0,
        min_fit_clients=n,
        min_available_clients=n,
        fraction_evaluate=0.0,
        initial_parameters=ndarrays_to_parameters([np.zeros(d, np.float32)]),
    )
    ctx = LegacyContext(
        Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        config=ServerConfig(num_rounds=1),
        strategy=strategy,
        client_manager=cm,
    )
    cfg = ConfigRecord()
    cfg["current_round"] = 1
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = cfg
    ctx.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([np.zeros(d, np.float32)]), keep_input=True
    )
    wf = SecAggPlusWorkflow(num_shares=shares, reconstruction_threshold=threshold, clipping_range=1.0)
    t0 = time.perf_counter()
    wf(grid, ctx)
    secs = time.perf_counter() - t0
    params = compat.arrayrecord_to_parameters(ctx.state.array_records[MAIN_PARAMS_RECORD], keep_input=True)
    avg = parameters_to_ndarrays(params)[0].astype(np.float64)
    survivors = [i for i in data if i not in dropped]
    exact = np.sum([data[i] for i in survivors], axis=0, dtype=np.float64)
    everyone = np.sum([data[i] for i in data], axis=0, dtype=np.float64)
    # Flower's grid: 2 c / Q per step of the weighted value, the weight num_examples / max_weight (here 1 / 1000)
    # rounded to round(Q / max_weight) / Q
    q, max_weight = wf.quantization_range, wf.max_weight
    step = 2 * wf.clipping_range / q / (round(q / max_weight) / q)
    return {
        "system": "flwr SecAgg+",
        "clients": n,
        "length": d,
        "num_shares": shares,
        "threshold": threshold,
        "dropout": dropout,
        "survivors": len(survivors),
        "delivered": delivered,
        "seconds": secs,
        "max_abs_error_of_mean": float(np.max(np.abs(avg - exact / len(survivors)))),
        "max_abs_error_of_sum": float(np.max(np.abs(avg * len(survivors) - exact))),
        "error_bound_of_sum": len(survivors) * step,
        "max_abs_error_vs_all_n": float(np.max(np.abs(avg * len(survivors) - everyone))),
    }


def run_securefed(n: int, d: int, degree: int, threshold: int, seed: int = 0) -> dict:
    from securefed.securesum import SecAggAggregator

    rng = np.random.default_rng(seed)
    ups = [rng.uniform(-1, 1, d) for _ in range(n)]
    agg = SecAggAggregator(clip_range=1.0, degree=degree, threshold=threshold, random_state=seed)
    t0 = time.perf_counter()
    res = agg.aggregate(ups)
    secs = time.perf_counter() - t0
    return {
        "system": "securefed SecAgg+",
        "clients": n,
        "length": d,
        "degree": degree,
        "threshold": threshold,
        "seconds": secs,
        "max_abs_error_of_sum": float(np.max(np.abs(res.total - np.sum(ups, axis=0)))),
        "bytes_up_per_client": res.bytes_up,
    }


def signature_cost(n: int, degree: int, threshold: int) -> dict:
    """Seconds securefed spends on Ed25519 in such a round (work Flower's SecAgg+ does not do: it has no
    signatures and no consistency check): unit costs measured now × the operation counts of one round
    (n signs of adverts + n of survivor sets; clients verify degree adverts and threshold survivor-set
    signatures each; the server verifies n adverts and n survivor-set signatures)."""
    from securefed.securesum import crypto

    sk, pk = crypto.ed25519_keypair()
    msg = bytes(100)
    sig = crypto.sign(sk, msg)
    t0 = time.perf_counter()
    for _ in range(200):
        crypto.verify(pk, sig, msg, what="bench")
    t_verify = (time.perf_counter() - t0) / 200
    t0 = time.perf_counter()
    for _ in range(200):
        crypto.sign(sk, msg)
    t_sign = (time.perf_counter() - t0) / 200
    verifies = n * degree + n * threshold + 2 * n
    return {
        "verify_us": round(t_verify * 1e6, 1),
        "sign_us": round(t_sign * 1e6, 1),
        "verifies": verifies,
        "signs": 2 * n,
        "seconds": round(verifies * t_verify + 2 * n * t_sign, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--length", type=int, default=100_000)
    ap.add_argument("--shares", type=int, default=7, help="Flower num_shares (includes the client itself)")
    ap.add_argument("--threshold", type=int, default=4)
    ap.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="Flower only: this fraction of the nodes drops after the share-keys stage",
    )
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    import flwr

    for _ in range(args.repeats):
        ours = run_securefed(args.clients, args.length, args.shares - 1, args.threshold)
        theirs = run_flower(args.clients, args.length, args.shares, args.threshold, dropout=args.dropout)
        sig = signature_cost(args.clients, args.shares - 1, args.threshold)
        print(
            json.dumps(
                {
                    "flwr_version": flwr.__version__,
                    "securefed": ours,
                    "flower": theirs,
                    "speedup": theirs["seconds"] / ours["seconds"],
                    "securefed_signature_cost": sig,
                    "speedup_without_signature_work": theirs["seconds"] / (ours["seconds"] - sig["seconds"]),
                }
            )
        )


if __name__ == "__main__":
    main()
