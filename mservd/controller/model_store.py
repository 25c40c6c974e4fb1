"""Where a register call's archive comes from: a file or model folder inside the model store
(never outside it), or an http(s) URL that ``allowed_urls`` allows, downloaded into the store
with every redirect checked, a size cap and one deadline."""

from __future__ import annotations

import re
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from mservd.errors import BadRequest, Conflict, ModelNotFound

DOWNLOAD_READ_TIMEOUT = 10.0  # seconds one read of a download may wait
DOWNLOAD_DEADLINE = 120.0  # seconds for a whole download


class ModelStore:
    """The model store folder (``--model-store``) and the URLs a register call may name."""

    def __init__(self, folder: str | None, allowed_urls: tuple[str, ...],
                 max_archive_bytes: int, flat: bool = False) -> None:
        self.folder = Path(folder).resolve() if folder else None
        self.flat = flat  # the workflow store: an archive directly in it, as TorchServe says
        self.allowed_urls = allowed_urls
        self.max_archive_bytes = max_archive_bytes

    def path_of(self, url: str, startup: bool = False) -> Path:
        """The archive or model folder ``url`` names inside the model store; at start-up (the
        operator's own --models) an absolute path may also name one anywhere."""
        if "\x00" in url:
            raise BadRequest(f"Invalid url {url!r}: it contains a NUL byte.")
        if url.startswith("file://"):
            url = urllib.parse.urlsplit(url).path
        if startup and Path(url).is_absolute():
            if not Path(url).exists():
                raise ModelNotFound(f"Model not found: {url}")
            return Path(url).resolve()
        if self.folder is None:
            raise BadRequest("No model store is configured; start mservd with --model-store.")
        candidate = Path(url)
        if self.flat and len(candidate.parts) != 1:
            raise BadRequest(f"Invalid url {url!r}: name a file directly in the store, not in "
                             "a subfolder.")
        if ".." in candidate.parts:
            raise BadRequest(f"Invalid url {url!r}: '..' is not allowed; name an archive "
                             "inside the model store.")
        path = (self.folder / candidate).resolve()
        if not path.is_relative_to(self.folder):
            raise BadRequest(f"Invalid url {url!r}: it points outside the model store "
                             f"{str(self.folder)!r}.")
        if not path.exists():
            raise ModelNotFound(f"Model not found in model store: {url}")
        return path

    def check_allowed(self, url: str) -> None:
        patterns = self.allowed_urls
        if not any(re.fullmatch(p, url) for p in patterns):
            raise BadRequest(f"URL {url!r} is not allowed: it matches no allowed_urls pattern. "
                             "Add a pattern to allowed_urls in config.properties to allow it.")

    def download(self, url: str) -> Path:
        """Fetch an allowed URL into the model store: http(s) only, every redirect checked
        against allowed_urls, a size cap, and one deadline for the whole download (it holds
        the controller's archive thread). Nothing is left in the store if it fails."""
        if self.folder is None:
            raise BadRequest("No model store is configured to download into.")
        name = Path(urllib.parse.urlsplit(url).path).name
        if not name or name.startswith("."):
            raise BadRequest(f"URL {url!r} names no archive file.")
        target = self.folder / name
        if target.exists():
            raise Conflict(f"Archive {name} already exists in the model store.")
        tmp = target.with_name(f".{name}.{uuid.uuid4().hex[:8]}.part")
        cap = self.max_archive_bytes
        deadline = time.monotonic() + DOWNLOAD_DEADLINE
        opener = urllib.request.build_opener(_CheckedRedirects(self.check_allowed))
        try:
            with opener.open(url, timeout=DOWNLOAD_READ_TIMEOUT) as answer, \
                    open(tmp, "wb") as out:
                total = 0
                while chunk := answer.read1(1 << 20):
                    total += len(chunk)
                    if total > cap:
                        raise BadRequest(f"Download of {url!r} passed max_archive_bytes ({cap}).")
                    if time.monotonic() > deadline:
                        raise BadRequest(f"Download of {url!r} took longer than "
                                         f"{DOWNLOAD_DEADLINE:.0f} s.")
                    out.write(chunk)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(target)
        return target


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to an http(s) URL that allowed_urls allows, as the first was."""

    def __init__(self, check: Callable[[str], None]) -> None:
        self.check = check

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise BadRequest(f"URL {req.full_url!r} redirects to {newurl!r}: only http and "
                             "https are followed.")
        self.check(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)
