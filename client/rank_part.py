"""A snapshot's per-rank part (step, RNG states, the Stateful objects' state), signed by the job.

The part is a pickle, and unpickling runs what the pickle names; it is read from the snapshot's
files or from the old job's memory over the network. So it is sealed: a magic prefix, then the
HMAC-SHA256, under the job's key (client/job_key.py), of the rank's state-dict key and the pickle,
then the pickle. `unseal` checks the HMAC before anything is unpickled: a part changed, moved to
another rank, or signed with another key is refused. A part without the prefix was written by a
faultcast from before signing: it is unpickled only through the RANK_PART allowlist
(client/restricted_pickle.py), enough for generator states and plain data.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle

from faultcast.client import restricted_pickle

MAGIC = b"FCSIGNED1\n"  # never the start of a pickle (protocol 2 and up begin with b"\x80")
_MAC_BYTES = hashlib.sha256().digest_size


class RankPartError(ValueError):
    """The per-rank part does not verify, or (unsigned) holds what may not be unpickled."""


def seal(part: object, key: bytes, name: str) -> bytes:
    """`part` pickled and signed with `key` for the state-dict key `name` (its rank's)."""
    pickled = pickle.dumps(part)
    return MAGIC + _mac(key, name, pickled) + pickled


def unseal(blob: bytes, key: bytes, name: str) -> object:
    """What `seal` sealed for `name`, once its signature verifies with `key`; an unsigned (older)
    part through the restricted unpickler. RankPartError otherwise."""
    if not blob.startswith(MAGIC):
        try:
            return restricted_pickle.loads(blob, restricted_pickle.RANK_PART, f"the unsigned part {name}")
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            raise RankPartError(f"the snapshot's unsigned part {name} is refused: {exc}") from exc
    mac, pickled = blob[len(MAGIC) : len(MAGIC) + _MAC_BYTES], blob[len(MAGIC) + _MAC_BYTES :]
    if not hmac.compare_digest(mac, _mac(key, name, pickled)):
        raise RankPartError(
            f"the snapshot's part {name} does not verify with the job's key: it was changed, or "
            "written for another rank or by another job; it is not unpickled"
        )
    # Signed with the job's own key: written by this job, like a checkpoint torch.load would trust.
    return pickle.loads(pickled)  # noqa: S301


def _mac(key: bytes, name: str, pickled: bytes) -> bytes:
    return hmac.new(key, name.encode() + b"\n" + pickled, hashlib.sha256).digest()
