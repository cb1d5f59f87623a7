"""Optional completion backend for any OpenAI-compatible chat-completions server (OpenAI, vLLM, SGLang,
llama.cpp server, DeepSeek ...). Uses ``httpx`` when installed, else the standard library ``urllib``.
No request is made at import or construction time; medadapt's tests never call a network.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from medadapt.errors import MedAdaptError


class BackendError(MedAdaptError):
    """The completion server could not be reached or answered with an error."""


def _post_json(url: str, payload: dict, headers: dict, timeout: float) -> dict:
    body = json.dumps(payload).encode("utf-8")
    try:
        import httpx
    except ImportError:  # pragma: no cover - depends on the environment
        httpx = None
    if httpx is not None:
        try:
            resp = httpx.post(url, content=body, headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            raise BackendError(f"request to {url} failed: {exc}") from None
        if resp.status_code >= 400:
            raise BackendError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
        return resp.json()
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - user-given URL
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise BackendError(f"{url} answered HTTP {exc.code}: {exc.read()[:200]!r}") from None
    except (urllib.error.URLError, TimeoutError) as exc:
        raise BackendError(f"request to {url} failed: {exc}") from None


class OpenAIChat:
    """``complete(prompt) -> reply`` against ``{base_url}/chat/completions``.

    Args:
        model: model name on the server.
        base_url: e.g. ``https://api.openai.com/v1`` or ``http://localhost:8000/v1``.
        api_key: bearer token; default: the environment variable named by ``api_key_env``.
        temperature / max_tokens / timeout: request settings.
        max_retries: retries (exponential back-off) on transport errors.
        post: the transport ``post(url, payload, headers, timeout) -> dict`` (tests inject a fake).
    """

    def __init__(self, model: str, base_url: str = "https://api.openai.com/v1", api_key: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.0, max_tokens: int = 512,
                 timeout: float = 60.0, max_retries: int = 2,
                 post: Callable[[str, dict, dict, float], dict] | None = None):
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
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
        for attempt in range(self.max_retries + 1):
            try:
                reply = self.post(url, payload, headers, self.timeout)
                break
            except BackendError:
                if attempt == self.max_retries:
                    raise
                time.sleep(2**attempt)
        try:
            return reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"unexpected reply from {url}: {str(reply)[:200]}") from None
