"""Key expiry and rotation, with a fake clock: nothing here waits."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from mservd.auth import API, INFERENCE, MANAGEMENT, KeyStore, read_key_file
from mservd.errors import BadRequest, Unauthorized


class Clock:
    """Seconds since the epoch that move only when the test says so."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def keys(tmp_path: Path, clock: Clock) -> KeyStore:
    return KeyStore(tmp_path / "key_file.json", expiration_min=1.0, clock=clock)


def test_keystore_accepts_a_live_key(keys: KeyStore, clock: Clock) -> None:
    clock.now += 59.0
    keys.check(INFERENCE, keys.keys[INFERENCE])
    keys.check(MANAGEMENT, keys.keys[MANAGEMENT])


def test_keystore_refuses_an_expired_key_until_rotated(keys: KeyStore, clock: Clock) -> None:
    old = keys.keys[INFERENCE]
    clock.now += 61.0
    with pytest.raises(Unauthorized, match="the inference key has expired"):
        keys.check(INFERENCE, old)
    new = keys.rotate(keys.keys[API], INFERENCE)
    assert new != old
    assert read_key_file(keys.path)[INFERENCE] == new
    keys.check(INFERENCE, new)
    with pytest.raises(Unauthorized, match="the token is not the inference key"):
        keys.check(INFERENCE, old)
    # the rotated key lives a full lifetime from the rotation, then expires in its turn
    clock.now += 59.0
    keys.check(INFERENCE, new)
    clock.now += 2.0
    with pytest.raises(Unauthorized, match="expired"):
        keys.check(INFERENCE, new)


def test_keystore_expires_management_and_inference_keys_independently(
        keys: KeyStore, clock: Clock) -> None:
    clock.now += 61.0
    keys.rotate(keys.keys[API], MANAGEMENT)
    keys.check(MANAGEMENT, keys.keys[MANAGEMENT])
    with pytest.raises(Unauthorized, match="expired"):
        keys.check(INFERENCE, keys.keys[INFERENCE])


def test_keystore_api_key_never_expires(keys: KeyStore, clock: Clock) -> None:
    clock.now += 10 * 365 * 86400.0
    keys.check(API, keys.keys[API])
    assert keys.rotate(keys.keys[API], INFERENCE)


def test_keystore_rotation_needs_the_api_key(keys: KeyStore) -> None:
    with pytest.raises(Unauthorized, match="not the API key"):
        keys.rotate(keys.keys[INFERENCE], INFERENCE)
    with pytest.raises(Unauthorized, match="no bearer token"):
        keys.rotate(None, INFERENCE)


def test_keystore_rotation_refuses_an_unknown_type(keys: KeyStore) -> None:
    with pytest.raises(BadRequest, match="Unknown token type 'API'"):
        keys.rotate(keys.keys[API], API)


def test_keystore_key_file_stamps_expiry_from_the_clock(keys: KeyStore, clock: Clock) -> None:
    clock.now += 100.0
    keys.rotate(keys.keys[API], INFERENCE)
    doc = json.loads(keys.path.read_text())
    stamp = dt.datetime.strptime(doc[INFERENCE]["expiration time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert stamp.replace(tzinfo=dt.UTC).timestamp() == pytest.approx(clock.now + 60.0)
    assert keys.path.stat().st_mode & 0o777 == 0o600


def test_keystore_removes_its_key_file_but_not_one_another_daemon_wrote(tmp_path) -> None:
    ours = KeyStore(tmp_path / "key_file.json", expiration_min=1.0)
    ours.remove()
    assert not ours.path.exists()
    ours.write()
    theirs = KeyStore(tmp_path / "key_file.json", expiration_min=1.0)  # started here since
    ours.remove()
    assert read_key_file(theirs.path) == theirs.keys
