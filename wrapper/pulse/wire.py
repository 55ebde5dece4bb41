"""The pulse's wire: where a job's hub listens, and what its frames say.

One TCP connection per node and attempt, from the node's watcher to the hub (the watcher
of the job's first node). Lines, each at most ``LINE_MAX`` bytes:

- ``HELLO <credential>``, both ways first: a MUNGE credential (wrapper.pulse.munge) whose
  payload is ``{"v": 1, "role": "beat"|"hub", "job": ID, "attempt": N, "node": NAME}``;
  each side accepts the other only when munged says root encoded it for this job and
  attempt (and, at the hub, for one of the job's nodes);
- ``B <seq>`` (a beat, every ``[pulse] interval``) and the hub's ``A <seq>`` (its ack);
- ``S <json>`` (the node's sample of its ranks, wrapper/watch/ranks.py, every
  ``[pulse] sample_interval``, at most ``SAMPLE_MAX`` bytes);
- ``FENCED`` from the hub (this node was judged lost: stop the job's processes) and
  ``END`` (the hub stops: the attempt is over, fence nothing).

The hub's port is none of the site's to hand out per job: it is the first free port of a
short sequence drawn from ``[pulse] ports`` by the job and attempt, the same for every
node, so no file or controller is asked to find it. A port taken by anything else is
skipped (the beater checks the hub's credential, so a squatter is only a closed door).
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Any

from wrapper.config import port_range

if TYPE_CHECKING:
    from wrapper.pulse import Signer

__all__ = ["candidates", "hello_payload", "port_range", "read_hello"]

V = 1
LINE_MAX = 4096  # a credential of a ~100-byte payload is ~200 bytes
SAMPLE_MAX = 64 << 10  # a node's sample of 64 ranks is ~16 KiB
CANDIDATES = 8


def candidates(job_id: str, attempt: int, ports: tuple[int, int],
               count: int = CANDIDATES) -> list[int]:
    """The ports the hub of ``job_id``'s attempt tries in order (and the beaters too)."""
    lo, hi = ports
    span = hi - lo + 1
    start = zlib.crc32(f"{job_id}:{attempt}".encode()) % span
    return [lo + (start + i) % span for i in range(min(count, span))]


def hello_payload(role: str, job_id: str, attempt: int, node: str, *, port: int,
                  nonce: str, echo: str = "") -> bytes:
    """What a hello's credential carries. ``port``: the hub's port this connection is on
    (the beater's dial, the hub's own), so that a hello cannot be relayed to another port
    by whoever holds one of the job's sequence first; ``nonce``: fresh per hello;
    ``echo``: the hub's answer repeats the beater's nonce, so its hello is this
    connection's and no other."""
    return json.dumps({"v": V, "role": role, "job": job_id, "attempt": attempt,
                       "node": node, "port": port, "nonce": nonce, "echo": echo},
                      separators=(",", ":")).encode()


def nonce() -> str:
    import secrets

    return secrets.token_hex(8)


def read_hello(line: bytes, signer: Signer, *, role: str, job_id: str, attempt: int,
               uid: int, port: int, echo: str | None = None) -> dict[str, Any] | None:
    """The fields of a ``HELLO`` line when munged says root (``uid``) signed it for this
    job, attempt and hub port in ``role`` (and, with ``echo``, in answer to that nonce);
    else None: anything else, forged, replayed, expired, relayed, or munged failing."""
    from wrapper.pulse.munge import MungeError

    if not line.startswith(b"HELLO MUNGE:") or len(line) > LINE_MAX:
        return None
    try:
        cred = signer.decode(line[len(b"HELLO "):])
    except MungeError:
        return None
    if cred.uid != uid:
        return None
    try:
        data = json.loads(cred.payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != V or data.get("role") != role \
            or data.get("job") != job_id or data.get("attempt") != attempt \
            or data.get("port") != port or not isinstance(data.get("node"), str) \
            or not isinstance(data.get("nonce"), str) \
            or (echo is not None and data.get("echo") != echo):
        return None
    return data
