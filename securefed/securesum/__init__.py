"""Secure aggregation for securefed: SecAgg+ (masking) and CKKS (TenSEAL), sans-I/O, with a simulator.

Threat models, stated plainly:

* **SecAgg+** (:mod:`.secagg`): the server learns only the sum of the surviving clients' inputs,
  provided fewer than ``t`` of any client's ``k`` neighbours collude with it. Signatures stop it from
  swapping keys; the consistency check stops it from showing clients different survivor sets.
* **CKKS** (:mod:`.ckks`): the server holds only a public TenSEAL context and cannot decrypt; but the
  key holder and every client it handed the secret key to *can* decrypt any individual ciphertext, so
  the server colluding with any one of them learns every input. The decryptor decrypts only a sum it
  has checked: over a survivor set it confirmed, signed by a quorum, of at least ``min_survivors``
  signed uploads that it re-adds itself. Decrypted sums are rounded with randomised rounding to the
  stated precision before release (Li & Micciancio 2021).
"""

from .aggregators import SecAggAggregator
from .ckks import CKKSAggregator, CKKSClient, CKKSRoundSpec, CKKSServer
from .graph import choose_parameters, harary_graph
from .runner import TAMPER_KINDS
from .secagg import STAGES, DEFAULT_TIMEOUTS, RoundSpec, SecAggClient, SecAggServer
from .simulator import simulate

__all__ = ["SecAggAggregator", "CKKSAggregator", "simulate", "choose_parameters", "harary_graph", "TAMPER_KINDS",
           "STAGES", "DEFAULT_TIMEOUTS", "RoundSpec", "SecAggClient", "SecAggServer", "CKKSClient", "CKKSServer",
           "CKKSRoundSpec"]
