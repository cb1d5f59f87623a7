"""No credential from a remote server's answer reaches an error message (issue 43 item 3): a judge endpoint
that answers 401 and echoes the request (``Authorization`` header included) in its body, a reply that is not
JSON, a transport that puts the server's text in its own errors, a judge reply that quotes the key. The
server is a local ``http.server`` on 127.0.0.1 (no network), as in ``test_trust_models.py``."""

from __future__ import annotations

import http.server
import json
import threading
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.curation import CMEDTEB_RUBRIC, BackendError, OpenAIChat, PromptJudge
from medadapt.curation.judges import JudgeError
from medadapt.errors import redact

#: Looks like no known key format: only the exact-secret redaction can catch it.
KEY = "Zq8-live/AB+cd=ef_0123456789xyz"


def _leaks(message: str) -> list[str]:
    """Every 8-character piece of the key found in ``message`` (a key cut in half is a leak too)."""
    return [KEY[i:i + 8] for i in range(len(KEY) - 7) if KEY[i:i + 8] in message]


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every POST with ``status`` and a body that echoes the request's headers as ``mode`` says."""

    mode = "json"
    status = 401

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization", "")
        headers = {"Authorization": auth, **dict(self.headers.items())}  # the key within the quoted 200 characters
        body = {
            "json": json.dumps({"error": "unauthorized", "headers": headers}),
            "text": "\n".join(f"{k}: {v}" for k, v in headers.items()),
            "cut": "x" * 190 + auth,  # the key straddles the 200-character cut of the message
            "bare": f"invalid key {auth.split()[-1]}",
            "url": f"see https://example.org/keys?api_key={quote(auth.split()[-1], safe='')}&x=1",
            "escaped": json.dumps({"got": auth.split()[-1]}).replace("/", "\\/"),
        }[self.mode].encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [401, 200])  # 200: a body quoted in the error as no chat completion
@pytest.mark.parametrize("mode", ["json", "text", "cut", "bare", "url", "escaped"])
def test_an_echoed_key_never_reaches_the_error(mode, status, echo_server, monkeypatch):
    monkeypatch.setattr(_Echo, "mode", mode)
    monkeypatch.setattr(_Echo, "status", status)
    chat = OpenAIChat("m", echo_server, api_key=KEY, max_retries=0)
    with pytest.raises(BackendError) as err:
        chat("hi")
    message = str(err.value)
    assert _leaks(message) == [], message
    expected = ("answered HTTP 401" if status == 401 else "unexpected reply" if mode in ("json", "escaped")
                else "not JSON")  # a 200 with JSON that is no chat completion, or with no JSON at all
    assert expected in message and "***" in message, message


def test_a_client_error_is_not_retried(echo_server, monkeypatch):
    calls = []
    monkeypatch.setattr(_Echo, "mode", "json")
    monkeypatch.setattr("medadapt.curation.openai_backend.time.sleep", calls.append)
    with pytest.raises(BackendError, match="HTTP 401") as err:
        OpenAIChat("m", echo_server, api_key=KEY, max_retries=3)("hi")
    assert calls == [] and err.value.status == 401  # a wrong key fails at once, no back-off


@pytest.mark.parametrize("raised", [
    lambda url, payload, headers: BackendError(f"HTTP 401: {headers}"),  # a transport quoting the request
    lambda url, payload, headers: BackendError(f"upstream said: token={KEY}; Bearer {KEY[:10]}"),
])
def test_a_custom_transports_error_is_redacted(raised):
    def post(url, payload, headers, timeout):
        raise raised(url, payload, headers)

    with pytest.raises(BackendError) as err:
        OpenAIChat("m", "http://localhost:9/v1", api_key=KEY, post=post, max_retries=0)("hi")
    assert _leaks(str(err.value)) == [] and "***" in str(err.value), str(err.value)


def test_unexpected_reply_and_judge_reply_are_redacted():
    echo = OpenAIChat("m", "http://localhost:9/v1", api_key=KEY, post=lambda u, p, h, t: {"echo": h})
    with pytest.raises(BackendError, match="unexpected reply") as err:
        echo("hi")
    assert _leaks(str(err.value)) == []
    # the model's reply quotes the key: the judge's error (no JSON object in it) does not
    quoting = OpenAIChat("m", "http://localhost:9/v1", api_key=KEY,
                         post=lambda u, p, h, t: {"choices": [{"message": {"content": f"your key is {KEY}"}}]})
    with pytest.raises(JudgeError, match="holds no JSON object") as err:
        PromptJudge(quoting, CMEDTEB_RUBRIC, retries=0)("q", ["p"])
    assert _leaks(str(err.value)) == [] and "***" in str(err.value)


@pytest.mark.parametrize("text, secrets, expected", [
    ("Authorization: Bearer abc.DEF-123", (), "Authorization: ***"),
    ('{"Authorization": "Basic dXNlcjpwYXNz"}', (), '{"Authorization": "***"}'),
    ("key sk-proj-0123456789abcdef rejected", (), "key sk-*** rejected"),
    ("GET /v1?api_key=abc123&x=1", (), "GET /v1?api_key=***&x=1"),
    ('"password": "hunter22"', (), '"password": "***"'),
    ("https://bob:hunter22@proxy.example/v1 refused", (), "https://***@proxy.example/v1 refused"),
    (f"x {KEY} y {quote(KEY, safe='')} z", (KEY,), "x *** y *** z"),
    ("model not found", ("k",), "model not found"),  # a 1-character key is not replaced everywhere
    ("Incorrect API key provided: sk-proj-****abcd.", (), "Incorrect API key provided: sk-proj-****abcd."),
    ("got Bearer dXNlcjpwYXNz", (), "got Bearer ***"),
    ("missing Bearer token; try Basic authentication", (), "missing Bearer token; try Basic authentication"),
])
def test_redact(text, secrets, expected):
    assert redact(text, secrets) == expected


def test_redact_cuts_after_redacting():
    text = "x" * 195 + KEY
    assert redact(text, [KEY], limit=200) == "x" * 195 + "***"
    assert _leaks(redact(text, [KEY], limit=210)) == []


def test_cli_label_with_a_key_echoing_server_prints_one_clean_line(echo_server, tmp_path, monkeypatch):
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"query": "gout", "passages": ["uric acid", "asthma"]}) + "\n")
    monkeypatch.setenv("FAKE_MEDADAPT_KEY", KEY)
    monkeypatch.setattr(_Echo, "mode", "text")
    judge = f"openai:m@{echo_server}"
    res = CliRunner().invoke(app, ["data", "label", "--input", str(items), "--output", str(tmp_path / "l.jsonl"),
                                   "--judge", judge, "--judge", judge, "--api-key-env", "FAKE_MEDADAPT_KEY", "-q"])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "HTTP 401" in lines[0], res.output
    assert _leaks(res.output) == [], res.output
    assert not (tmp_path / "l.jsonl").exists()
