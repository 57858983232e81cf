"""Small dumps that are plain data and still pathological to decode (issue 16, findings 6 and 7)."""

from __future__ import annotations

import pickle
from pathlib import Path

# Every multiple of the Mersenne prime 2**61 - 1 hashes to 0 in CPython (int hashing is modulo
# it), so a dict of them probes through every earlier key on each insert: quadratic.
_MODULUS = 2**61 - 1


def colliding_dict_pickle(keys: int) -> bytes:
    """A protocol-2 pickle of ``{k * (2**61 - 1): None}``, byte for byte as ``pickle.dumps`` writes
    it (one ``MARK ... SETITEMS`` per thousand items, and an empty one after a last full batch);
    40,000 keys are 507 KiB. Written directly: building the dict to pickle it is the same quadratic
    work the test is about (19 s of CPU for 40,000 keys), paid by the test process."""
    assert keys > 1 and all(hash(k * _MODULUS) == 0 for k in (1, 2, keys))
    out = [b"\x80\x02}q\x00"]  # PROTO 2, EMPTY_DICT, BINPUT 0
    for start in range(0, keys, 1000):
        out.append(b"(")
        out.extend(pickle.dumps(k * _MODULUS, protocol=2)[2:-1] + b"N" for k in range(start, min(keys, start + 1000)))
        out.append(b"u")
    if keys % 1000 == 0:
        out.append(b"(u")
    return b"".join([*out, b"."])


def colliding_dict_one_setitems(keys: int) -> bytes:
    """The same dict with all its items under one ``MARK ... SETITEMS``: the whole quadratic build
    runs inside one C call, where no Python-level check can interrupt it."""
    items = b"".join(pickle.dumps(k * _MODULUS, protocol=2)[2:-1] + b"N" for k in range(1, keys))
    return b"\x80\x02}(" + items + b"u."


def write_empty_object_flood(path: Path, mib: int) -> Path:
    """``{"version": "2.10", "entries": [{}, {}, ...]}`` of about ``mib`` MiB, written in pieces so
    that the test process itself never holds the decoded shape."""
    piece = b"{}," * (1 << 18)
    with path.open("wb") as out:
        out.write(b'{"version": "2.10", "pg_status": {}, "entries": [')
        for _ in range(mib * (1 << 20) // len(piece)):
            out.write(piece)
        out.write(b"{}]}")
    return path
