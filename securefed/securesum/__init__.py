"""Secure aggregation for securefed: SecAgg+ (masking) and CKKS (TenSEAL), sans-I/O, with a simulator.

Threat model (docs/threat-model-secure-sum.md): the coordinator may deviate arbitrarily and collude with up to
c sites; every site enforces its own floors before it computes anything (:mod:`.threat`).

* **SecAgg+** (:mod:`.secagg`): the server learns only the sum over one survivor set U per round. Each site
  requires 2t > k + c (it can never lose both shares of its secrets) and reveals shares only after ≥ q
  signatures from distinct members of the same U with 2q > n + c (the server cannot equivocate about U); every
  message that changes the result is signed; a misbehaving client is dropped, not the round aborted. The input
  can be bound after the share stage (the late-bound schedule, :mod:`.secagg_client`), and every survivor can
  check the released total against the server's sum proof (:mod:`.secagg_proof`).
* **CKKS** (:mod:`.ckks`): the server holds only a public TenSEAL context and cannot decrypt; the key holder
  and at most one fallback decryptor (not every site) hold the secret key, so the server colluding with one of
  those two reads every upload — it learns nothing more with any other site. Decryptions are flooded
  (λ = 40 bits of security, the σ stated in the spec) and rounded; the coordinator range-checks them.

Both protocols' machines have one shape (:mod:`.machine`): a transition table, a fail-closed server base
class, one in-process round driver returning a :class:`~.machine.RoundOutcome`. TenSEAL is imported only when
CKKS is used.
"""

from .aggregators import SecAggAggregator
from .graph import choose_parameters, harary_graph
from .runner import TAMPER_KINDS
from .secagg import DEFAULT_TIMEOUTS, STAGES, InputSpec, RoundSpec, SetupSpec
from .secagg_client import SecAggClient
from .secagg_server import SecAggServer
from .secagg_proof import SumProofError, verify_sum
from .simulator import simulate

__all__ = [
    "SecAggAggregator",
    "CKKSAggregator",
    "simulate",
    "choose_parameters",
    "harary_graph",
    "TAMPER_KINDS",
    "STAGES",
    "DEFAULT_TIMEOUTS",
    "RoundSpec",
    "SetupSpec",
    "InputSpec",
    "SecAggClient",
    "SecAggServer",
    "CKKSClient",
    "CKKSServer",
    "CKKSRoundSpec",
    "SumProofError",
    "verify_sum",
]

_CKKS = {"CKKSAggregator", "CKKSClient", "CKKSServer", "CKKSRoundSpec"}


def __getattr__(name):
    if name in _CKKS:
        from . import ckks

        return getattr(ckks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
