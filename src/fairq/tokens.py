"""A waiting room's keys: its admission tokens (Ed25519 JWTs) and its tickets.

Every room has one 32-byte *root secret*: the ``secret=`` its processes pass to
``broker.waiting_room()``, or else one generated once and kept in the backend, so every
process of the room derives the same keys. Two keys are derived from it with HKDF-SHA256,
each bound to the room's name (one application secret can serve many rooms, and no two
rooms share a key):

* the **signing key**, Ed25519: admission tokens are JWTs signed with EdDSA, the header
  carries its key id (``kid``, the RFC 7638 thumbprint of the public key), and the public
  key is published as a JWKS document so a gateway can verify tokens offline;
* the **ticket key**: a ticket is ``<arrival number>.<MAC>.<fan id>``, the MAC a keyed
  BLAKE2b of the room, number and fan. A room hands out tickets, never looks them up: a
  status request decodes the arrival number from the ticket and checks its MAC, so status
  costs no lookup per fan, and nobody can forge someone else's ticket (and with it their
  admission token) by guessing numbers.

A token's claims are ``room``, ``ticket``, ``fan``, ``iat`` (admission time), ``exp``
(``iat + token_ttl``) and ``jti`` (unique within the room; :meth:`WaitingRoom.consume
<fairq.waitingroom.WaitingRoom.consume>` burns it). Signing is deterministic (Ed25519), so
a fan who asks again gets the very same token.

Needs the ``room`` extra (``pip install 'fairq[room]'``: PyJWT with cryptography), which
``fairq[server]`` includes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
from typing import Any

from .errors import InvalidTicket, InvalidToken
from .extras import MissingExtra

try:
    import jwt
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("waiting rooms need PyJWT and cryptography", "room", exc) from exc

__all__ = ["ALGORITHM", "CLAIMS", "SECRET_BYTES", "RoomKeys", "b64url", "new_root_secret"]

ALGORITHM = "EdDSA"
SECRET_BYTES = 32
#: the claims every admission token carries
CLAIMS = ("room", "ticket", "fan", "iat", "exp", "jti")
_MAC_BYTES = 12  # 96 bits: 16 characters of base64url
_MAX_FUTURE_IAT = 300.0  # seconds of clock skew tolerated for a token's issue time


def b64url(data: bytes) -> str:
    """Base64url without padding (RFC 7515)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def new_root_secret() -> bytes:
    """A fresh 32-byte root secret from the operating system's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def _derive(root: bytes, purpose: str, room: str) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=b"fairq waiting room",
        info=f"{purpose}\x00{room}".encode(),
    ).derive(root)


class RoomKeys:
    """The signing and ticket keys of one room, derived from its root secret (and, for
    tickets, the room's creation time ``epoch``)."""

    __slots__ = ("_private", "_public_raw", "_ticket_key", "jwk", "kid", "room")

    def __init__(self, room: str, root: bytes, epoch: float = 0.0) -> None:
        if not isinstance(root, bytes) or len(root) != SECRET_BYTES:
            raise ValueError(f"a room's secret must be {SECRET_BYTES} bytes")
        self.room = room
        self._private = Ed25519PrivateKey.from_private_bytes(_derive(root, "signing", room))
        self._public_raw = self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        # the room's creation time is part of the ticket key: the tickets of a deleted room
        # mean nothing to a new room of the same name, even with the same secret
        self._ticket_key = _derive(root, f"tickets\x00{epoch!r}", room)
        x = b64url(self._public_raw)
        # RFC 7638: the thumbprint hashes the required members in lexicographic order
        thumb = f'{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}'.encode()
        self.kid = b64url(hashlib.sha256(thumb).digest())
        self.jwk: dict[str, str] = {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": x,
            "kid": self.kid,
            "use": "sig",
            "alg": ALGORITHM,
        }

    @staticmethod
    def kid_of(room: str, root: bytes) -> str:
        """The key id the room's tokens carry when its root secret is ``root``."""
        return RoomKeys(room, root).kid

    def jwks(self) -> dict[str, Any]:
        """The JWKS document (RFC 7517) that publishes the room's public key."""
        return {"keys": [dict(self.jwk)]}

    # -- tickets ----------------------------------------------------------------------
    def _mac(self, seq: int, fan: str) -> str:
        digest = hashlib.blake2b(
            f"{self.room}\x00{seq}\x00{fan}".encode(),
            key=self._ticket_key,
            digest_size=_MAC_BYTES,
        ).digest()
        return b64url(digest)

    def ticket(self, seq: int, fan: str) -> str:
        """The ticket of the fan who arrived ``seq``-th."""
        return f"{seq:x}.{self._mac(seq, fan)}.{fan}"

    def parse_ticket(self, ticket: object) -> tuple[int, str]:
        """``(arrival number, fan id)`` of a ticket this room issued; ``InvalidTicket``
        for anything else (malformed, forged, altered, another room's)."""
        if not isinstance(ticket, str) or len(ticket) > 200:
            raise InvalidTicket(f"not a ticket of waiting room {self.room!r}")
        seq_part, _, rest = ticket.partition(".")
        mac, _, fan = rest.partition(".")
        try:
            seq = int(seq_part, 16)
        except ValueError:
            seq = 0
        if (
            seq < 1
            or seq_part != f"{seq:x}"  # one spelling per ticket: no 0x1, +1, 0001, 1_0
            or not fan
            or not hmac.compare_digest(mac, self._mac(seq, fan))
        ):
            raise InvalidTicket(f"not a ticket of waiting room {self.room!r}")
        return seq, fan

    # -- tokens -----------------------------------------------------------------------
    def sign(self, seq: int, fan: str, admitted_at: float, expires_at: float) -> str:
        """The admission token of a fan admitted at ``admitted_at``."""
        ticket = self.ticket(seq, fan)
        claims = {
            "room": self.room,
            "ticket": ticket,
            "fan": fan,
            "iat": math.floor(admitted_at),
            "exp": math.floor(expires_at),
            "jti": ticket.split(".", 2)[1],
        }
        return jwt.encode(claims, self._private, algorithm=ALGORITHM, headers={"kid": self.kid})

    def verify(self, token: object, now: float) -> tuple[dict[str, Any], int]:
        """The claims of a valid token of this room at time ``now``, and the fan's arrival
        number; ``InvalidToken`` if it is malformed, forged or altered, signed with another
        key, for another room, not yet valid or expired."""
        if isinstance(token, bytes):
            token = token.decode("latin-1")
        if not isinstance(token, str) or not token or len(token) > 4096:
            raise InvalidToken("not an admission token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise InvalidToken(f"not an admission token: {exc}") from None
        if header.get("alg") != ALGORITHM:
            raise InvalidToken(f"admission tokens are signed with {ALGORITHM}")
        if header.get("kid") != self.kid:
            raise InvalidToken(
                f"the token was signed with another key (kid {header.get('kid')!r}), not "
                f"waiting room {self.room!r}'s"
            )
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._private.public_key(),
                algorithms=[ALGORITHM],
                # time is checked below against the broker's clock, not the wall clock
                options={"verify_exp": False, "verify_iat": False, "require": list(CLAIMS)},
            )
        except jwt.InvalidTokenError as exc:
            raise InvalidToken(f"invalid admission token: {exc}") from None
        if claims.get("room") != self.room:
            raise InvalidToken(
                f"the token is for waiting room {claims.get('room')!r}, not {self.room!r}"
            )
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(exp, int | float) or not isinstance(iat, int | float):
            raise InvalidToken("the token's iat and exp must be numbers")
        if now >= exp:
            raise InvalidToken("the admission token has expired")
        if iat > now + _MAX_FUTURE_IAT:
            raise InvalidToken("the admission token is not valid yet")
        try:
            seq, fan = self.parse_ticket(claims.get("ticket"))
        except InvalidTicket:
            raise InvalidToken("the token's ticket is not this room's") from None
        if fan != claims.get("fan"):
            raise InvalidToken("the token's fan does not match its ticket")
        return claims, seq
