"""The byte codec is frozen: one hand-built instance of every message type encodes to the bytes recorded
(SHA-256 and length) before the field lists were restated as annotations (issue 22), and decodes back to
itself. A change of field order, kind or width in ``securesum/messages.py`` changes these bytes and fails here;
a deliberate wire change must bump ``messages.VERSION`` and re-record them."""

import hashlib

import pytest

from securefed.securesum import messages as M

SID, RND = bytes(range(16)), 7
B32 = bytes(range(32))
B64 = bytes(range(64))
SHARE = (1 << 263) + 12345  # an int33 value with the top byte in use


def _instances():
    ke = M.KeyEntry(3, B32, B32[::-1], bytes(32), B64)
    si = M.ShareItem(2, b"ciphertext", B32, B32[::-1], B64)
    sv = M.ShareValue(4, SHARE)
    se = M.SignatureEntry(1, B64)
    dg = M.InputDigest(2, B32, B64)
    ie = M.InputEntry(2, (b"chunk-a", b"", b"chunk-b"))
    pi = M.ProofInput(2, (0, 1), b"\x01\x02" * 4, B64)
    sc = M.SecretEntry(1, B32)
    return {
        "BoundConsistencyRequest": M.BoundConsistencyRequest(SID, RND, 4, (0, 2), (dg, dg)),
        "SumProof": M.SumProof(SID, RND, 1, B32, (0, 2), 32, b"\x00" * 8, (pi,), (se,), (ke,), (sc,), (sc,)),
        "AdvertiseKeys": M.AdvertiseKeys(SID, RND, 3, B32, B32[::-1], bytes(32), B64),
        "KeysBroadcast": M.KeysBroadcast(SID, RND, 1, (ke, M.KeyEntry(5, B32, B32, B32, B64[::-1]))),
        "EncryptedShares": M.EncryptedShares(SID, RND, 2, (si,)),
        "ForwardedShares": M.ForwardedShares(SID, RND, 6, (si, si)),
        "MaskedInput": M.MaskedInput(SID, RND, 2, 32, b"\x01\x02\x03\x04" * 3, (0, 1, 5), B64),
        "ConsistencyRequest": M.ConsistencyRequest(SID, RND, 4, (0, 2, 3, 9)),
        "ConsistencySignature": M.ConsistencySignature(SID, RND, 2, B64),
        "UnmaskRequest": M.UnmaskRequest(SID, RND, 3, (0, 3), (se, M.SignatureEntry(3, B64[::-1]))),
        "UnmaskResponse": M.UnmaskResponse(SID, RND, 3, (sv,), (M.ShareValue(7, 1),), B64),
        "SharePlaintext": M.SharePlaintext(SID, RND, 1, 2, SHARE, 99),
        "ContextHandoff": M.ContextHandoff(SID, RND, 0, 1, b"secret context"),
        "PublicContext": M.PublicContext(SID, RND, 0, b"public context", B64),
        "EncryptedInput": M.EncryptedInput(SID, RND, 1, (b"c0", b"c1")),
        "EncryptedSum": M.EncryptedSum(SID, RND, 0, (0, 1, 2), (b"sum",)),
        "DecryptedSum": M.DecryptedSum(SID, RND, 1, 2.0**-20, b"\x00" * 16, B64),
        "SignedInput": M.SignedInput(SID, RND, 2, (b"x" * 5,), B64),
        "DecryptRequest": M.DecryptRequest(SID, RND, 0, (0, 2), (se,), (dg,), (ie,), (b"s0", b"s1")),
    }


# recorded from the codec of commit 1e40bd4 (FIELDS tuples beside the annotations); the two late-bound / proof
# messages from the FIELDS codec of their branch (4f5c1bf) before they were restated as annotations
GOLDEN = {
    "BoundConsistencyRequest": (248, "3f4bd1a686b625cbea3af1acfc45d5be2a48d90b9649e8480db47f289ae23568"),
    "SumProof": (502, "2c1532e627578256e51c70389f9d9ba204fd1e694787119b42c8046b4b040355"),
    "AdvertiseKeys": (192, "81d3a077d9d1cbd69a4e3456044c1f61fd8c73cb8be10987ee75a236df88c9bd"),
    "ConsistencyRequest": (52, "cab0b7b6fd80176c5e724746a47af45c84545b68af6cf0edd17d2a31d8ca9157"),
    "ConsistencySignature": (96, "4e5e4d6e511be2236511c0bee2f553530dadd4711b94cf759476b20895782281"),
    "ContextHandoff": (54, "fa8878afa294e6aa2ba4120e709b66e0cc6278253a5c609850bb7220623a6d4a"),
    "DecryptRequest": (274, "a6d50ad157a30a3917e830ab0c94d3630ffe8236b1d956ace41419469034b2cc"),
    "DecryptedSum": (124, "9dee99dbb0033ae1a4f903db50aba07439a42ec8f9be61b36a354572fe32704f"),
    "EncryptedInput": (48, "9c9b1cee1b41864ab593d1c8531a67a03607da23e162e13d10feaf87d3e2de34"),
    "EncryptedShares": (182, "56abc571606b9c9a51a5d6f4b381412e256d86304cb84b2c0adeb01f636aa350"),
    "EncryptedSum": (59, "faf74c1b8e5fb1c1217088ebcaa7bf304653b7897131bb555a196801e16398d1"),
    "ForwardedShares": (328, "7602f78709943174dfa635fc16c8908d13ce863e7bdc48b31b47a838da20f4ac"),
    "KeysBroadcast": (364, "3389f5c5288291e9e79e90f21f87cc2ec88a422c1ee9e3c82d25a4375d5c3165"),
    "MaskedInput": (129, "2320a108a6ab444517a197c2312f99f8dd949b969dd7c0009685a122755696f1"),
    "PublicContext": (114, "f2581d3b255a46584b3095959e372ebbdeadbb5709629a35749d0eeeb7eb9e1c"),
    "SharePlaintext": (102, "08faaaf08f8d1549b1fd958955b88838dfc1d940039ab80856c81db2d3cce0dd"),
    "SignedInput": (109, "3385c5cb65a4e1c6f97fab8b80d6e89e52603c5e0b6dc404c9694d92a5c9c49a"),
    "UnmaskRequest": (184, "705137080487bc44fba8b4b022b3e0cba98436d0e5e54875e343d9b2e9106da1"),
    "UnmaskResponse": (178, "44bb959e178bc8d924f44322dfa1617a164edc598381a0eb56702d085261c728"),
}


@pytest.mark.parametrize("name", sorted(_instances()))
def test_every_message_encodes_to_the_recorded_bytes(name):
    msg = _instances()[name]
    data = M.encode(msg)
    assert (len(data), hashlib.sha256(data).hexdigest()) == GOLDEN[name]
    assert M.decode(data) == msg
    assert M.encode(M.decode(data)) == data


def test_every_message_type_is_covered():
    assert sorted(_instances()) == sorted(cls.__name__ for cls in M.MESSAGE_TYPES.values())
