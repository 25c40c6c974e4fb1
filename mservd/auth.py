"""Token authorization: the three keys, their expiry, and the key file users read them from.

Keys live in the controller alone; frontends forward the bearer token they received and the
controller checks it with a constant-time comparison. A frontend lent a worker (``leases.py``)
checks the inference token itself, against the key's SHA-256 digest and expiry that came with
the lease; a rotation ends every lease. The key file has TorchServe's layout and is written
with mode 0600.

The dashboard's cookie holds a *session*, never the management key: a random id the key
store hands out for the management key (the ``token`` verb with type ``dashboard``), valid in
its place for SESSION_HOURS at most and never past the key's own expiry, ended by its logout
(type ``dashboard-logout``, the session as the token) or by a rotation of the management key.
Sessions are kept as SHA-256 digests, MAX_SESSIONS at most (the oldest ended first).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mservd.errors import BadRequest, Unauthorized

INFERENCE = "inference"
MANAGEMENT = "management"
API = "API"
SESSION = "dashboard"  # a token verb's type: open a dashboard session for the management key
LOGOUT = "dashboard-logout"  # ... and end the session given as the token
SESSION_PREFIX = "mservd-session-"  # what a session id starts with, unlike any key
SESSION_HOURS = 8.0  # a dashboard session's longest life (the management key's, if shorter)
MAX_SESSIONS = 64  # live sessions kept; past it a login ends the oldest


def _new_key() -> str:
    return secrets.token_urlsafe(18)


class KeyStore:
    """The keys and their expiry times.

    :param clock: seconds since the epoch, read for every expiry decision; a test passes a fake
        one so that a key expires without real waiting.
    """

    def __init__(self, path: Path, expiration_min: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.lifetime = expiration_min * 60.0
        self.clock = clock
        self.keys: dict[str, str] = {INFERENCE: _new_key(), MANAGEMENT: _new_key(), API: _new_key()}
        now = self.clock()
        self.expires: dict[str, float] = {INFERENCE: now + self.lifetime,
                                          MANAGEMENT: now + self.lifetime}
        self.sessions: dict[bytes, float] = {}  # digest of a dashboard session -> its expiry
        self.write()

    def check(self, api: str, token: str | None) -> None:
        """Raise 401 unless ``token`` is the live key of ``api`` (for the management key, or
        a live dashboard session opened with it)."""
        if api == MANAGEMENT and token and token.startswith(SESSION_PREFIX):
            self._check_session(token)
            return
        self._check_key(api, token)

    def _check_key(self, api: str, token: str | None) -> None:
        if not token:
            raise Unauthorized("Token authorization failed: no bearer token given. "
                               f"Send 'Authorization: Bearer <{api} key>' from {self.path.name}.")
        if not hmac.compare_digest(token.encode(), self.keys[api].encode()):
            raise Unauthorized(f"Token authorization failed: the token is not the {api} key.")
        self._check_expiry(api)

    def inference_check(self) -> tuple[bytes, float]:
        """What a frontend holding a lease checks an inference token against: the key's
        SHA-256 digest (never the key itself) and its expiry."""
        return hashlib.sha256(self.keys[INFERENCE].encode()).digest(), self.expires[INFERENCE]

    def rotate(self, api_token: str | None, kind: str) -> str:
        """Replace the inference or management key; needs the API key. Rotating the
        management key ends every dashboard session. Type ``dashboard`` opens a session for
        the management key instead, and ``dashboard-logout`` ends the session given
        (the ``token`` verb is the one verb that checks its own token)."""
        if kind == SESSION:
            return self.open_session(api_token)
        if kind == LOGOUT:
            self.end_session(api_token)
            return ""
        self._check_key(API, api_token)
        if kind not in (INFERENCE, MANAGEMENT):
            raise BadRequest(f"Unknown token type {kind!r}; use 'inference' or 'management'.")
        self.keys[kind] = _new_key()
        self.expires[kind] = self.clock() + self.lifetime
        if kind == MANAGEMENT:
            self.sessions.clear()
        self.write()
        return self.keys[kind]

    # -- the dashboard's sessions ----------------------------------------------------------

    def open_session(self, management_key: str | None) -> str:
        """A new session id for the holder of the management key itself (not a session)."""
        self._check_key(MANAGEMENT, management_key)
        now = self.clock()
        for digest, expiry in list(self.sessions.items()):
            if expiry <= now:
                del self.sessions[digest]
        while len(self.sessions) >= MAX_SESSIONS:
            del self.sessions[next(iter(self.sessions))]  # the oldest
        session = SESSION_PREFIX + secrets.token_urlsafe(24)
        self.sessions[_digest(session)] = min(now + SESSION_HOURS * 3600.0,
                                              self.expires[MANAGEMENT])
        return session

    def session_expiry(self, session: str) -> float | None:
        """When ``session`` ends (seconds since the epoch), None if it is not live."""
        expiry = self.sessions.get(_digest(session))
        return expiry if expiry is not None and self.clock() < expiry else None

    def end_session(self, session: str | None) -> None:
        """The dashboard's logout: ``session`` no longer opens anything."""
        if not session or self.sessions.pop(_digest(session), None) is None:
            raise Unauthorized("Token authorization failed: that dashboard session is not "
                               "live (logged out, expired, or the management key rotated).")

    def _check_session(self, session: str) -> None:
        if self.session_expiry(session) is None:
            self.sessions.pop(_digest(session), None)
            raise Unauthorized("Token authorization failed: the dashboard session has ended "
                               "(logged out, expired, or the management key rotated). Log in "
                               "again with the management key.")

    def _check_expiry(self, api: str) -> None:
        expiry = self.expires.get(api)
        if expiry is not None and self.clock() > expiry:
            raise Unauthorized(f"Token authorization failed: the {api} key has expired. "
                               "Rotate it with GET /token?type=" + api)

    def write(self) -> None:
        def stamp(t: float) -> str:
            return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        doc = {
            MANAGEMENT: {"key": self.keys[MANAGEMENT], "expiration time": stamp(self.expires[MANAGEMENT])},
            INFERENCE: {"key": self.keys[INFERENCE], "expiration time": stamp(self.expires[INFERENCE])},
            API: {"key": self.keys[API]},
        }
        # a fresh file of our own (never a file or link left at a known name), private from
        # its first byte, then renamed over the key file
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(doc, handle, indent=2)
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise

    def remove(self) -> None:
        """At stop, as TorchServe does: delete the key file, unless it no longer holds these
        keys (another daemon started from the same folder wrote its own since)."""
        try:
            if read_key_file(self.path) == self.keys:
                self.path.unlink()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # gone, or not ours to judge: leave it


def _digest(session: str) -> bytes:
    return hashlib.sha256(session.encode()).digest()


def read_key_file(path: Path) -> dict[str, str]:
    """The keys as a client reads them: ``{"inference": ..., "management": ..., "API": ...}``."""
    doc = json.loads(Path(path).read_text())
    return {name: entry["key"] for name, entry in doc.items()}
