"""CKKS secure sum with TenSEAL, split as SecAgg+ is (issue 12): parameters and hygiene (:mod:`.params`), TenSEAL
helpers and signed payloads (:mod:`.context`), the client and server machines (:mod:`.machines`), the in-process
runner (:mod:`.runner`) and the aggregator (:mod:`.aggregator`). TenSEAL is imported only when a context is made.
"""

from .aggregator import CKKSAggregator
from .context import (
    can_decrypt,
    context_payload,
    encrypt_vector,
    input_payload,
    load_public_context,
    sum_ciphertexts,
    survivors_payload,
    upload_digest,
)
from .context import make_context as _make_context
from .context import public_bytes as _public_bytes
from .context import secret_bytes as _secret_bytes
from .machines import _STATE_MAGIC, CKKSClient, CKKSServer
from .params import (
    CKKS_STAGES,
    CKKS_TIMEOUTS,
    FLOOD_BITS,
    MAX_COEFF_BITS,
    VERIFY_MODES,
    CKKSParams,
    CKKSRoundSpec,
    check_ckks_params,
    choose_ckks_parameters,
    ckks_error_bound,
    decode_ckks_spec,
    encode_ckks_spec,
    flood_shift,
    flood_sigma,
    gaussian_noise,
    randomized_round,
    release_error_bound,
)
from .runner import CKKS_TAMPER_KINDS, run_ckks_round
from ..machine import UnexpectedMessageError

__all__ = [
    "CKKS_STAGES",
    "CKKS_TIMEOUTS",
    "VERIFY_MODES",
    "CKKSParams",
    "CKKSRoundSpec",
    "CKKSClient",
    "CKKSServer",
    "choose_ckks_parameters",
    "CKKSAggregator",
    "run_ckks_round",
    "randomized_round",
    "encode_ckks_spec",
    "decode_ckks_spec",
    "upload_digest",
    "input_payload",
    "CKKS_TAMPER_KINDS",
    "release_error_bound",
    "UnexpectedMessageError",
    "check_ckks_params",
    "flood_sigma",
    "flood_shift",
    "ckks_error_bound",
    "gaussian_noise",
    "FLOOD_BITS",
    "MAX_COEFF_BITS",
    "decrypt_sum",
]


def decrypt_sum(priv_ctx, chunks, length: int, step: float, sigma: float = 0.0):
    """Key-holder side: decrypt summed chunks, flood with N(0, σ²) and randomised-round to ``step``."""
    from .context import decrypt_vectors, vectors

    raw = decrypt_vectors(vectors(priv_ctx, chunks, "sum"), length)
    return randomized_round(raw + gaussian_noise(length, sigma), step)


def __getattr__(name):
    if name == "ts":  # the TenSEAL module, on first use
        import tenseal

        return tenseal
    raise AttributeError(name)
