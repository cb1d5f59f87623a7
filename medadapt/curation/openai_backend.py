"""Completion backend for any OpenAI-compatible chat-completions server, through ``httpx``.
The API key goes only to the base URL: no plain ``http://`` to another host unless allowed, no redirects,
server text in errors only through :func:`medadapt.errors.redact` (docs/guarantees.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from medadapt.errors import ConfigError, MedAdaptError, redact


class BackendError(MedAdaptError):
    """The server could not be reached or answered an error (``status``: its HTTP status, or ``None``)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def header_secrets(headers: dict) -> list[str]:
    """The header values that may hold a credential, each also without its scheme (``Bearer sk-...``):
    what :func:`redact` removes from the server's text."""
    found = []
    for name, value in (headers or {}).items():
        if str(name).lower() in ("content-type", "accept") or not value:
            continue
        found += [str(value), str(value).split()[-1]]
    return found


def _redirect_error(url: str, code: int, location: str | None, secrets=()) -> BackendError:
    message = (f"{url} answered HTTP {code}, a redirect to {location or '(no location)'}; medadapt does not "
               "follow redirects (the API key would go there too): set the base URL to the final address")
    return BackendError(redact(message, secrets), status=code)


def _post_json(url: str, payload: dict, headers: dict, timeout: float) -> dict:
    """POST ``payload``, return the JSON answer; errors are :class:`BackendError` with redacted text."""
    import httpx

    secrets = header_secrets(headers)
    shown = redact(url, secrets)  # the URL as printed: a password in it (https://user:key@host) is not
    try:
        resp = httpx.post(url, content=json.dumps(payload).encode("utf-8"), headers=headers, timeout=timeout,
                          follow_redirects=False)
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


def is_loopback_host(host: str | None) -> bool:
    """``localhost`` or a loopback IP address."""
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
    """ConfigError for a base URL that is not ``http(s)://host``, or plain http to another machine with a
    key (unless ``allow_insecure_http``)."""
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
        api_key: bearer token (default: the environment variable ``api_key_env``).
        max_retries: retries with back-off, on transport errors and answers other than a redirect or a
            client error (4xx but 408 / 429).
        post: the transport ``post(url, payload, headers, timeout) -> dict`` (tests inject a fake).
        allow_insecure_http: send the key over plain http to another host (refused by default).
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
