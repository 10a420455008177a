"""Sealed data connections: authenticated encryption of the TCP data channel in a keyed job.

A job with a CURVE cluster key (:mod:`pskv.transport.security`) encrypts everything on
ZeroMQ; its workers on other hosts still send their arrays on the TCP data connections
of :mod:`pskv.transport.stream` — through CURVE they moved 4-5x slower
(``docs/security.md``) — and this module seals them. One :class:`SealedChannel` per
connection owns its keys and both record counters; the stream calls it once per piece.

**Key agreement** (per connection; modelled on Noise's ``NNpsk0``, an ephemeral X25519
exchange authenticated by a pre-shared key, written with ``cryptography``'s primitives):
every node derives a pre-shared key from the cluster's CURVE secret key with HKDF-SHA256
(:class:`ClusterKeys`). The connecting worker opens
with :data:`SEALED_MAGIC`, its tag and a fresh X25519 public key; the server answers with
a fresh X25519 public key of its own. Both compute the X25519 shared secret and expand it
with HKDF-SHA256, salted with the pre-shared key, over the whole opening (the tag names
the worker's session and lane, then both public keys): 64 bytes, the worker-to-server key
and the server-to-worker key. Only a holder of the cluster key derives them: a peer
without it fails at its first record, and a capture replayed on a new connection meets
the server's new public key, so its records fail too. Fresh keys per connection keep a
capture secret from whoever steals the key file later (forward secrecy, as CURVE's).

**Records**: AES-256-GCM (``cryptography``'s ``AESGCM``: OpenSSL's with AES-NI), nonce =
the direction's record counter (12 bytes, little-endian, from 0; one key per direction,
so a nonce never repeats under a key). A message is two records: its table (the frame
count in the clear, as associated data, then the sealed lengths and a 16-byte tag) and its
body (every frame's bytes, sealed together, then a tag). The receiver opens the table
before it allocates anything for the body (the lengths are the sender's, unmodified) and
opens the body in place; a record that fails (modified, replayed, reordered, cut or
sealed with another key) raises :class:`~pskv.errors.ProtocolError`: the connection is
dropped, logged by its owner with the peer's name, and nothing of it is handed on.

Without a key every connection gets :data:`PLAIN`, whose methods hand their input back:
a plain connection pays a few no-op calls per message.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from pskv.errors import ProtocolError

__all__ = ["NO_KEYS", "PLAIN", "PLAIN_MAGIC", "SEALED_MAGIC", "Channel", "ClusterKeys", "Keys", "SealedChannel"]

PLAIN_MAGIC = b"pskv-stream-1:"
SEALED_MAGIC = b"pskv-sealed-1:"
TAG_BYTES = 16  # GCM's authentication tag, after every record
PUBLIC_BYTES = 32  # an X25519 public key
_PSK_INFO = b"pskv data channel: pre-shared key from the cluster key"
_KEYS_INFO = b"pskv data channel v1: worker->server, server->worker keys; opening "
_COUNT = struct.Struct("<I")
_GATHER = 64 << 10  # bodies up to this size are copied into one buffer and sealed in one call
_PIECE = 4 << 20  # a bigger body is sealed into buffers of this size (reused heap memory, no fresh maps)
_OPEN_AT_ONCE = 1 << 30  # AESGCM takes less than 2 GiB a call: bigger records are opened in pieces


class Channel:
    """One connection's sealing without a key: every record passes as it is (:data:`PLAIN`).

    :class:`SealedChannel` has the same methods; the stream calls them without knowing which.
    """

    __slots__ = ()
    magic = PLAIN_MAGIC  # opens a connection, before the tag
    hello_bytes = 0  # the connecting side's bytes after the tag
    answer_bytes = 0  # the accepting side's answer to the opening
    overhead = 0  # bytes a record carries beyond its plaintext

    def hello(self) -> bytes:
        """What the connecting side sends after its tag."""
        return b""

    def accept(self, tag: bytes, hello: bytes) -> bytes:
        """The accepting side read the opening (``tag``, the peer's ``hello``): its answer, to send."""
        return b""

    def finish(self, tag: bytes, answer: bytes) -> None:
        """The connecting side read the ``answer`` to its opening."""

    def refusal(self, opening: bytes) -> str:
        """Why an opening that is not this channel's is refused (for the ProtocolError)."""
        if opening.startswith(SEALED_MAGIC):
            return "a sealed data connection (the peer has a cluster key) to a node without one: refused"
        return f"not a pskv data connection (it opened with {opening[:40]!r})"

    def seal(self, views: list[memoryview]) -> list[memoryview]:
        """A message's buffers as they go on the wire: ``views[0]`` its table (count and lengths), then its frames."""
        return views

    def open_table(self, record: Any, count: int) -> Any:
        """The lengths of a message of ``count`` frames, from their ``record`` (the bytes after the count)."""
        return record

    def open_body(self, record: memoryview) -> memoryview:
        """A message's frames' bytes, from their ``record`` (opened in place)."""
        return record


PLAIN = Channel()


class Keys:
    """A node's data-connection keys without a cluster key: every connection is plain (:data:`NO_KEYS`)."""

    __slots__ = ()

    def channel(self, name: str) -> Channel:
        """The sealing of a new connection called ``name`` (for error messages)."""
        return PLAIN


NO_KEYS = Keys()


class ClusterKeys(Keys):
    """A keyed node's data-connection keys: each connection gets a :class:`SealedChannel`.

    Args:
        secret: the cluster's CURVE secret key (32 bytes): the pre-shared key is derived
            from it with HKDF-SHA256, so it is never used as it is.
    """

    __slots__ = ("_psk",)

    def __init__(self, secret: bytes) -> None:
        self._psk = HKDF(hashes.SHA256(), 32, None, _PSK_INFO).derive(secret)

    def channel(self, name: str) -> SealedChannel:
        return SealedChannel(self._psk, name)


class SealedChannel(Channel):
    """One connection's keys and record counters, both directions (see the module's docstring).

    Args:
        psk: the pre-shared key (:class:`ClusterKeys`).
        name: the connection's name, for error messages.
    """

    __slots__ = ("_psk", "_name", "_private", "_out", "_in", "_out_key", "_in_key", "_sent", "_received")
    magic = SEALED_MAGIC
    hello_bytes = PUBLIC_BYTES
    answer_bytes = PUBLIC_BYTES
    overhead = TAG_BYTES

    def __init__(self, psk: bytes, name: str) -> None:
        self._psk = psk
        self._name = name
        self._private: X25519PrivateKey | None = X25519PrivateKey.generate()
        self._out: AESGCM | None = None
        self._in: AESGCM | None = None
        self._out_key = self._in_key = b""
        self._sent = self._received = 0  # records sealed and opened: the next nonce of each direction

    def hello(self) -> bytes:
        assert self._private is not None
        return self._private.public_key().public_bytes_raw()

    def accept(self, tag: bytes, hello: bytes) -> bytes:
        answer = self.hello()
        self._agree(tag, hello, hello, answer, outgoing=1)
        return answer

    def finish(self, tag: bytes, answer: bytes) -> None:
        self._agree(tag, answer, self.hello(), answer, outgoing=0)

    def _agree(self, tag: bytes, peer: bytes, worker: bytes, server: bytes, outgoing: int) -> None:
        """Derive both directions' keys from the exchange; ``outgoing``: 0 on the worker's side, 1 on the server's.

        Raises:
            ProtocolError: the peer's public key is not one (a low-order point: no shared secret).
        """
        assert self._private is not None
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(peer))
        except ValueError:
            raise ProtocolError(f"{self._name}: the peer's key exchange is invalid (a low-order X25519 point)") from None
        self._private = None  # used once
        keys = HKDF(hashes.SHA256(), 64, self._psk, _KEYS_INFO + tag + worker + server).derive(shared)
        halves = (keys[:32], keys[32:])
        self._out_key, self._in_key = halves[outgoing], halves[1 - outgoing]
        self._out, self._in = AESGCM(self._out_key), AESGCM(self._in_key)

    def refusal(self, opening: bytes) -> str:
        if opening.startswith(PLAIN_MAGIC):
            return "a plain data connection (the peer has no cluster key) to a keyed node: refused"
        return f"not a pskv data connection (it opened with {opening[:40]!r})"

    # -- sealing (the sending thread, under the connection's send lock) -----------------------
    def _nonce_out(self) -> bytes:
        nonce = self._sent.to_bytes(12, "little")
        self._sent += 1
        return nonce

    def seal(self, views: list[memoryview]) -> list[memoryview]:
        out = self._out
        assert out is not None, "sealing before the key exchange"
        table = views[0]
        sealed = bytearray(table.nbytes + TAG_BYTES)
        sealed[:_COUNT.size] = table[:_COUNT.size]
        out.encrypt_into(self._nonce_out(), table[_COUNT.size:], table[:_COUNT.size],
                         memoryview(sealed)[_COUNT.size:])
        return [memoryview(sealed), *self._seal_body(views[1:])]

    def _seal_body(self, frames: Sequence[memoryview]) -> list[memoryview]:
        """The body record: every frame's bytes sealed together, then the tag."""
        total = sum(f.nbytes for f in frames)
        nonce = self._nonce_out()
        if total <= _GATHER:  # one copy, one call
            body = bytearray(total + TAG_BYTES)
            at = 0
            for frame in frames:
                body[at:at + frame.nbytes] = frame
                at += frame.nbytes
            view = memoryview(body)
            assert self._out is not None
            self._out.encrypt_into(nonce, view[:total], None, view)
            return [view]
        encryptor = Cipher(algorithms.AES(self._out_key), modes.GCM(nonce)).encryptor()
        pieces: list[memoryview] = []
        piece, room = memoryview(b""), 0
        for frame in frames:
            at = 0
            while at < frame.nbytes:
                if not room:
                    piece = np.empty(min(_PIECE, total), np.uint8).data
                    pieces.append(piece)
                    total -= piece.nbytes
                    room = piece.nbytes
                n = min(room, frame.nbytes - at)
                start = piece.nbytes - room
                encryptor.update_into(frame[at:at + n], piece[start:start + n])
                at += n
                room -= n
        encryptor.finalize()
        pieces.append(memoryview(encryptor.tag))
        return pieces

    # -- opening (the one reading thread) ---------------------------------------------------------
    def _failed(self) -> ProtocolError:
        return ProtocolError(f"{self._name}: record {self._received - 1} from the peer failed authentication "
                             "(modified, replayed, reordered or cut on the way, or sealed with another key): "
                             "nothing of it was used")

    def open_table(self, record: Any, count: int) -> Any:
        view = memoryview(record).cast("B")
        nonce = self._received.to_bytes(12, "little")
        self._received += 1
        assert self._in is not None
        try:
            self._in.decrypt_into(nonce, view, _COUNT.pack(count), view[:-TAG_BYTES])
        except InvalidTag:
            raise self._failed() from None
        return view[:-TAG_BYTES]

    def open_body(self, record: memoryview) -> memoryview:
        nonce = self._received.to_bytes(12, "little")
        self._received += 1
        size = record.nbytes - TAG_BYTES
        plain = record[:size]
        try:
            if size <= _OPEN_AT_ONCE:
                assert self._in is not None
                self._in.decrypt_into(nonce, record, None, plain)
                return plain
            decryptor = Cipher(algorithms.AES(self._in_key), modes.GCM(nonce, bytes(record[size:]))).decryptor()
            for at in range(0, size, _OPEN_AT_ONCE):
                part = plain[at:at + _OPEN_AT_ONCE]
                decryptor.update_into(part, part)
            decryptor.finalize()
        except InvalidTag:
            raise self._failed() from None
        return plain
