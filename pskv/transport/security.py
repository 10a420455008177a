"""Authenticated, encrypted transport with ZeroMQ CURVE (optional).

Model: one **cluster key** per job — a CURVE key pair that every legitimate node holds
(``pskv keygen`` writes it; the launcher points every process at the file through
``PSKV_CURVE_KEY_FILE``). Every binding socket (scheduler, servers) is a CURVE server
with that secret key; every connecting socket is a CURVE client that presents the same
key pair and expects the same server key. A ZAP handler on each binding node admits a
client only if its public key is the cluster key's, so only a holder of the secret key
can talk to the job; all traffic is encrypted (Curve25519, XSalsa20-Poly1305). A refused
peer is logged with its address and the public key it presented. The TCP data
connections between hosts, outside ZeroMQ, are sealed with keys agreed from the same
cluster key (:attr:`CurveSecurity.data_keys`, :mod:`pskv.transport.sealed`). See
``docs/security.md`` for the threat model.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.utils import z85

from pskv.errors import InvalidArgumentError, TransportError
from pskv.transport.sealed import ClusterKeys

__all__ = ["CurveKeys", "CurveSecurity", "RefusalLog", "generate_keys", "write_key_file", "read_key_file"]

log = logging.getLogger("pskv.security")
KEY_FILE_HEADER = "# pskv CURVE cluster key (keep secret: anyone holding this file can join the job)"
Z85_KEY_LENGTH = 40
ZAP_DOMAIN = "pskv"
LOG_INTERVAL = 10.0  # seconds between two log lines about the same refused peer


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair, Z85-encoded (40 ASCII bytes each)."""

    public: bytes
    secret: bytes

    def __repr__(self) -> str:  # never print the secret
        return f"CurveKeys(public={self.public.decode()!r}, secret=<hidden>)"


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise TransportError("this libzmq was built without CURVE support; reinstall pyzmq from its wheels")


def generate_keys() -> CurveKeys:
    """A new random key pair."""
    _require_curve()
    public, secret = zmq.curve_keypair()
    return CurveKeys(public, secret)


def write_key_file(path: str | os.PathLike[str], keys: CurveKeys, overwrite: bool = False) -> Path:
    """Write ``keys`` to ``path`` readable by its owner only (mode 0600), atomically.

    Raises:
        InvalidArgumentError: the file exists and ``overwrite`` is False.
        OSError: it could not be written (no such folder, a folder at ``path``, ...); the
            temporary file (a copy of the secret key) is removed first.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise InvalidArgumentError(f"{path} exists; refusing to overwrite a key file (remove it first, or pass --force)")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(f"{KEY_FILE_HEADER}\npublic = {keys.public.decode()}\nsecret = {keys.secret.decode()}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_key_file(path: str | os.PathLike[str]) -> CurveKeys:
    """Read and check a key file written by :func:`write_key_file` / ``pskv keygen``.

    Raises:
        InvalidArgumentError: missing or unreadable, malformed, a public key that does not
            belong to the secret key, or readable by other users (group/other bits set).
    """
    _require_curve()
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"cannot read CURVE key file {path}: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidArgumentError(f"CURVE key file {path} is accessible by other users (mode {mode & 0o777:o}); "
                                   f"run: chmod 600 {path}")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise InvalidArgumentError(f"CURVE key file {path}: malformed line {line[:20]!r}...")
        fields[name.strip()] = value.strip()
    public, secret = fields.get("public", "").encode(), fields.get("secret", "").encode()
    if len(public) != Z85_KEY_LENGTH or len(secret) != Z85_KEY_LENGTH:
        raise InvalidArgumentError(f"CURVE key file {path} needs 'public' and 'secret' Z85 keys of 40 characters")
    try:
        derived = zmq.curve_public(secret)
    except (zmq.ZMQError, ValueError) as exc:
        raise InvalidArgumentError(f"CURVE key file {path}: the secret key is not valid Z85 ({exc})") from None
    if derived != public:
        raise InvalidArgumentError(f"CURVE key file {path}: the public key does not belong to the secret key")
    return CurveKeys(public, secret)


class CurveSecurity:
    """Applies the cluster key to sockets and runs the ZAP handler that admits peers.

    Args:
        keys: the cluster key pair.
        node: this node's name, for log messages.
    """

    def __init__(self, keys: CurveKeys, node: str = "") -> None:
        _require_curve()
        self.keys = keys
        self.node = node
        self._context: zmq.Context[Any] | None = None
        self.data_keys = ClusterKeys(z85.decode(keys.secret))  # sealing the data connections
        self.refused = 0  # peers refused so far (for tests and diagnostics)
        self.failed_handshakes = 0  # connections whose CURVE handshake failed (no key, another key)
        self._refusals = RefusalLog(log)

    def start(self, context: zmq.Context[Any]) -> None:
        """Start the ZAP handler on ``context`` (before binding server sockets; idempotent).

        One handler serves a context (ZeroMQ's ZAP endpoint is one per context): nodes of
        one process that share a context (tests) share it, and it stops with the last.

        Raises:
            TransportError: another key's handler already runs on ``context``.
        """
        if self._context is not None:
            return
        with _ZAP_LOCK:
            entry = _ZAP.get(id(context))
            if entry is None:
                from zmq.auth.thread import ThreadAuthenticator

                auth = ThreadAuthenticator(context, log=logging.getLogger("pskv.security.zap"))
                auth.start()
                auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)
                entry = _ZAP[id(context)] = _Zap(auth, self)
            elif entry.owner.keys != self.keys:
                raise TransportError("another CURVE cluster key's ZAP handler runs on this ZeroMQ context")
            entry.users += 1
        self._context = context

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP credentials check: admit only the cluster's public key (called by pyzmq)."""
        ok = key == self.keys.public
        if not ok:
            self.refused += 1
            self._refusals.error(key, f"{self.node or 'node'} refused a peer presenting CURVE public key "
                                      f"{key.decode(errors='replace')} (not the cluster key)")
        return ok

    def handshake_failed(self, endpoint: str, event: int, value: int) -> None:
        """A connection to ``endpoint`` failed its CURVE handshake (a socket monitor's event): logged.

        ZeroMQ drops such a peer before any message; a peer without the key, or with
        another cluster's, reconnects every 100 ms, so repeats are logged at most once
        every :data:`LOG_INTERVAL` seconds with their count.
        """
        self.failed_handshakes += 1
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return  # the ZAP handler logged it (callback) with the key presented
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            why = "a peer without CURVE (plain TCP) was refused"
        elif value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            why = "a peer whose CURVE keys are not the cluster key's was refused (cryptographic error)"
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            why = f"a peer's connection ended during the CURVE handshake ({os.strerror(value)}); nothing was accepted"
        else:
            why = (f"a peer failed the CURVE handshake (ZMTP protocol error {value:#x}, e.g. a replayed or "
                   "corrupted handshake) and was refused")
        self._refusals.error((endpoint, why), f"{self.node or 'node'} on {endpoint}: {why}")

    def server(self, sock: zmq.Socket[Any]) -> None:
        """Make a binding socket a CURVE server with the cluster key (call :meth:`start` first).

        Every peer is checked by the ZAP handler; without one running, ZeroMQ refuses
        every peer (``ZAP_ENFORCE_DOMAIN``) rather than admitting it unchecked.
        """
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN.encode()
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)

    def client(self, sock: zmq.Socket[Any]) -> None:
        """Make a connecting socket a CURVE client presenting the cluster key."""
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_serverkey = self.keys.public

    def stop(self) -> None:
        """Release the ZAP handler (stopped with its context's last user; idempotent)."""
        context, self._context = self._context, None
        if context is None:
            return
        with _ZAP_LOCK:
            entry = _ZAP.get(id(context))
            if entry is None:
                return
            entry.users -= 1
            if entry.users > 0:
                return
            del _ZAP[id(context)]
        entry.auth.stop()

    @classmethod
    def from_file(cls, path: str, node: str = "") -> CurveSecurity | None:
        """The security for key file ``path``, or None when ``path`` is empty (no CURVE).

        Raises:
            InvalidArgumentError: the file is missing, malformed or readable by others
                (see :func:`read_key_file`).
        """
        return cls(read_key_file(path), node) if path else None


class RefusalLog:
    """Log lines about refused peers, at most one per peer (or kind) every :data:`LOG_INTERVAL` s.

    A refused peer may retry at once, and forever (ZeroMQ reconnects every 100 ms); the
    repeats are counted and the next line says how many there were. The record is
    bounded (the entry logged longest ago is forgotten first).

    Args:
        logger: where the lines go.
        limit: peers (or kinds) remembered.
    """

    def __init__(self, logger: logging.Logger, limit: int = 1024) -> None:
        self._logger = logger
        self._limit = limit
        self._logged: dict[Any, tuple[float, int]] = {}  # what -> (last logged, repeats not logged since)

    def error(self, what: Any, message: str) -> None:
        """Log ``message`` at ERROR unless a line about ``what`` went out in the last interval."""
        now = time.monotonic()
        last, since = self._logged.get(what, (-LOG_INTERVAL, 0))
        if now - last < LOG_INTERVAL:
            self._logged[what] = (last, since + 1)
            return
        if what not in self._logged and len(self._logged) >= self._limit:
            del self._logged[min(self._logged, key=lambda k: self._logged[k][0])]
        self._logged[what] = (now, 0)
        if since:
            message += f" ({since} more time(s) in the last {LOG_INTERVAL:g} s)"
        self._logger.error("%s", message)

    def forget(self, what: Any) -> None:
        """Drop what is remembered about ``what``."""
        self._logged.pop(what, None)


@dataclass
class _Zap:
    """The ZAP handler of one context and how many nodes use it."""

    auth: Any
    owner: CurveSecurity
    users: int = 0


_ZAP: dict[int, _Zap] = {}  # by id() of the context
_ZAP_LOCK = threading.Lock()
