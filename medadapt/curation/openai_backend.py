"""Optional completion backend for any OpenAI-compatible chat-completions server (OpenAI, vLLM, SGLang,
llama.cpp server, ...), through ``httpx`` when installed, else ``urllib``; no request at import or
construction.

The API key goes only to the configured base URL: plain ``http://`` to a non-loopback host is refused unless
``allow_insecure_http=True``, redirects are never followed (the ``urllib`` fallback would re-send the
``Authorization`` header), and server text reaches errors only through :func:`medadapt.errors.redact`. See
docs/guarantees.md.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from medadapt.errors import ConfigError, MedAdaptError, redact


class BackendError(MedAdaptError):
    """The completion server could not be reached or answered with an error (``status``: the HTTP status of
    the answer, ``None`` when there was none)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def header_secrets(headers: dict) -> list[str]:
    """The values of the request headers that may hold a credential (all but ``Content-Type`` / ``Accept``),
    each also without its scheme (``Bearer sk-...`` -> ``sk-...``): what :func:`redact` removes from any text
    the server sends back."""
    found = []
    for name, value in (headers or {}).items():
        if str(name).lower() in ("content-type", "accept") or not value:
            continue
        found += [str(value), str(value).split()[-1]]
    return found


def _redirect_error(url: str, code: int, location: str | None, secrets=()) -> "BackendError":
    message = (f"{url} answered HTTP {code}, a redirect to {location or '(no location)'}; medadapt does not "
               "follow redirects (the API key would go there too): set the base URL to the final address")
    return BackendError(redact(message, secrets), status=code)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """``urllib`` handler refusing every redirect (the default handler re-sends the request headers,
    ``Authorization`` included, to the redirect's host, even over plain http)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise _redirect_error(req.full_url, code, newurl, header_secrets(dict(req.header_items())))


def _post_json(url: str, payload: dict, headers: dict, timeout: float) -> dict:
    """POST ``payload`` as JSON, return the JSON answer; every error is a :class:`BackendError` whose text
    from the server is redacted (:func:`header_secrets`) and cut to 200 characters."""
    body = json.dumps(payload).encode("utf-8")
    secrets = header_secrets(headers)
    shown = redact(url, secrets)  # the URL as printed: a password in it (https://user:key@host) is not
    try:
        import httpx
    except ImportError:  # pragma: no cover - depends on the environment
        httpx = None
    if httpx is not None:
        try:
            resp = httpx.post(url, content=body, headers=headers, timeout=timeout, follow_redirects=False)
        except httpx.HTTPError as exc:
            raise BackendError(redact(f"request to {url} failed: {exc}", secrets)) from None
        if 300 <= resp.status_code < 400:
            raise _redirect_error(url, resp.status_code, resp.headers.get("location"), secrets)
        if resp.status_code >= 400:
            raise BackendError(f"{shown} answered HTTP {resp.status_code}: {redact(resp.text, secrets, 200)}",
                               status=resp.status_code)
        try:
            return resp.json()
        except ValueError:
            raise BackendError(f"{shown} answered with something that is not JSON: "
                               f"{redact(resp.text, secrets, 200)!r}") from None
    opener = urllib.request.build_opener(_NoRedirect())
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    text = ""
    try:
        with opener.open(req, timeout=timeout) as resp:  # noqa: S310 - user-given URL
            text = resp.read().decode("utf-8", errors="replace")
        return json.loads(text)
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", errors="replace")
        raise BackendError(f"{shown} answered HTTP {exc.code}: {redact(text, secrets, 200)}",
                           status=exc.code) from None
    except (urllib.error.URLError, TimeoutError) as exc:
        raise BackendError(redact(f"request to {url} failed: {exc}", secrets)) from None
    except ValueError:
        raise BackendError(f"{shown} answered with something that is not JSON: "
                           f"{redact(text, secrets, 200)!r}") from None


def is_loopback_host(host: str | None) -> bool:
    """``localhost`` or a loopback IP address (``127.0.0.0/8``, ``::1``): a server on this machine."""
    import ipaddress

    if not host:
        return False
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_base_url(base_url: str, sends_key: bool, allow_insecure_http: bool = False) -> None:
    """Refuse a base URL that is not ``http(s)://host...``, and plain ``http://`` to another machine when an
    API key would be sent with it (unless ``allow_insecure_http``).

    Raises:
        ConfigError: with the reason and the way out.
    """
    parts = urlsplit(base_url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"base URL {redact(base_url)!r} is not an http:// or https:// URL with a host")
    if scheme == "http" and sends_key and not allow_insecure_http and not is_loopback_host(parts.hostname):
        raise ConfigError(
            f"refusing to send the API key over plain http to {parts.hostname} ({redact(base_url)}): use "
            "https://, or "
            "allow it explicitly (allow_insecure_http=True, CLI --allow-insecure-http)"
        )


class OpenAIChat:
    """``complete(prompt) -> reply`` against ``{base_url}/chat/completions``.

    Args:
        model: model name on the server.
        base_url: e.g. ``https://api.openai.com/v1`` or ``http://localhost:8000/v1``.
        api_key: bearer token; default: the environment variable named by ``api_key_env``.
        temperature / max_tokens / timeout: request settings.
        max_retries: retries (exponential back-off) on transport errors and on answers other than a redirect
            or a client error (4xx but 408 / 429: a wrong key or request fails at once).
        post: the transport ``post(url, payload, headers, timeout) -> dict`` (tests inject a fake).
        allow_insecure_http: send the API key over plain ``http://`` to a host other than this machine
            (refused by default: anyone on the path can read it).

    Raises:
        ConfigError: a base URL that is not http(s), or plain http to another host with an API key.
    """

    def __init__(self, model: str, base_url: str = "https://api.openai.com/v1", api_key: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.0, max_tokens: int = 512,
                 timeout: float = 60.0, max_retries: int = 2,
                 post: Callable[[str, dict, dict, float], dict] | None = None, allow_insecure_http: bool = False):
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        check_base_url(self.base_url, bool(self.api_key), allow_insecure_http)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.post = post or _post_json
        self.name = model

    def request(self, prompt: str) -> tuple[str, dict, dict]:
        """The URL, JSON payload and headers that :meth:`__call__` sends."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        payload = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                   "temperature": self.temperature, "max_tokens": self.max_tokens}
        return f"{self.base_url}/chat/completions", payload, headers

    def __call__(self, prompt: str) -> str:
        url, payload, headers = self.request(prompt)
        secrets = [self.api_key, *header_secrets(headers)]
        for attempt in range(self.max_retries + 1):
            try:
                reply = self.post(url, payload, headers, self.timeout)
                break
            except BackendError as exc:
                final = exc.status is not None and 300 <= exc.status < 500 and exc.status not in (408, 429)
                if attempt == self.max_retries or final or " a redirect to " in str(exc):
                    # redacted again: a transport given as `post` may put the server's text in its errors
                    raise BackendError(redact(str(exc), secrets), status=exc.status) from None
                time.sleep(2**attempt)
        try:
            return reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(redact(f"unexpected reply from {url}: ", secrets)
                               + redact(str(reply), secrets, 200)) from None
