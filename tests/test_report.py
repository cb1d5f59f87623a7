"""``medadapt report RUN_DIR``: a run of the tiny MoE recipe on a tiny random model becomes one HTML page.

* the page has its sections, figures embedded as PNG ``data:`` URIs, the metrics beside the baseline, and
  every text from data escaped (queries holding ``<script>`` stay text);
* the MoE training logs its expert load per step (``train_log.json``: ``expert_load``);
* per-query nDCG@10 matches hand-computed values;
* missing pieces (no baseline, data not found) become notes; a folder that is not a run is one clear error
  and nothing is written;
* a real headless Chromium (Debian's ``chromium``) opens the page: every image decodes (naturalWidth > 0)
  and the console shows no error or warning (driven through the DevTools protocol over
  ``--remote-debugging-pipe``, standard library only). Skipped, with the reason, where Chromium is absent.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from _helpers import PACKAGE, SYSTEMS, medadapt_imports
from conftest import TOPICS, write_beir

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
PAYLOAD = "<script>alert('x')</script>"
DESCRIPTION = "tiny <img src=x onerror=alert(1)> & run"

pytestmark = pytest.mark.usefixtures("_single_thread")


def _beir(root: Path) -> Path:
    """Tiny BEIR set: every test query carries a ``<script>`` payload, so any query shown must be escaped."""
    corpus, queries, test, train = {}, {}, {}, {}
    for i, (name, words) in enumerate(TOPICS):
        corpus[f"d{i}"] = (name, f"{name} is a condition with {words}.")
        corpus[f"e{i}"] = ("", f"treatment of {name} depends on symptoms; see {words.split()[1]}.")
        queries[f"q{i}"] = f"{PAYLOAD} symptoms of {name} {words.split()[2]}"
        queries[f"t{i}"] = f"treatment {name} {words.split()[0]}"
        queries[f"u{i}"] = f"what is {words.split()[3]} {words.split()[4]}"
        test[f"q{i}"] = {f"d{i}": 1}
        train[f"t{i}"] = {f"d{i}": 1}
        train[f"u{i}"] = {f"d{i}": 1, f"e{i}": 1}
    return write_beir(root, corpus, queries, {"test": test, "train": train})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_bert_dir) -> Path:
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    tmp = tmp_path_factory.mktemp("report")
    beir = _beir(tmp / "beir")
    out = tmp / "run"
    run_recipe(RECIPES / "med-moe-embed-tiny.yaml", out, [
        f"model.backbone={tiny_bert_dir}", f"data.path={beir}", "data.hard_negatives.window=[2, 8]",
        "training.batch_size=6", "training.shared_epochs=1", "training.random_routing_epochs=1",
        "training.epochs=3", "training.lr=0.01", "eval.split=test", "head.residual_scale=1.0",
        f"description={DESCRIPTION}"], cache=EmbeddingCache(tmp / "cache"), show_progress=False,
        log=lambda _m: None)
    return out


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory) -> Path:
    from medadapt.cache import EmbeddingCache
    from medadapt.report import build_report

    out = tmp_path_factory.mktemp("page") / "report.html"
    path = build_report(run_dir, out, cache=EmbeddingCache(run_dir.parent / "cache"), top=100,
                        images_dir=out.parent / "png", show_progress=False)
    assert path == out
    return out


def test_moe_training_logs_expert_load_per_step(run_dir):
    log = json.loads((run_dir / "train_log.json").read_text())
    load = log["expert_load"]
    assert load["names"] == ["mlp_swiglu", "mlp_gelu", "mlp_swiglu", "mlp_gelu"]
    steps = log["stage_steps"]
    rows = load["rows"]
    # one row per optimiser step of the routed stages (the shared stage routes nothing), in step order
    assert [r["stage"] for r in rows] == ["random"] * steps["random"] + ["learned"] * steps["learned"]
    assert [r["step"] for r in rows] == list(range(steps["shared"] + 1, sum(steps.values()) + 1))
    for r in rows:
        assert len(r["load"]) == 4 and math.isclose(sum(r["load"]), 1.0, abs_tol=1e-5)
        assert all(0.0 <= x <= 1.0 for x in r["load"])


def test_page_sections_figures_and_escaping(report, run_dir):
    html = report.read_text(encoding="utf-8")
    for section in ("training", "expert-load", "scores", "metrics", "queries"):
        assert f'<section id="{section}">' in html
    for fig in ("loss", "expert-load", "expert-load-steps", "scores", "metrics", "per-query"):
        assert f'<figure id="fig-{fig}"><img src="data:image/png;base64,' in html, fig
    assert sorted(p.name for p in (report.parent / "png").iterdir()) == sorted(
        f"{n}.png" for n in ("loss", "expert-load", "expert-load-steps", "scores", "metrics", "per-query"))
    # loss parts are named; the metrics table holds the files' values and their difference
    assert "<code>infonce</code>" in html and "<code>load_balance</code>" in html
    metrics = json.loads((run_dir / "metrics.json").read_text())
    base = json.loads((run_dir / "baseline_metrics.json").read_text())
    assert f"{metrics['ndcg@10']:.4f}" in html and f"{base['ndcg@10']:.4f}" in html
    assert f"{metrics['ndcg@10'] - base['ndcg@10']:+.4f}" in html
    # no markup from data: no <script> tag at all, and the only <img> tags are the six figures
    assert "<script" not in html.lower()
    assert html.count("<img ") == 6
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html  # a query, shown as text
    assert "tiny &lt;img src=x onerror=alert(1)&gt; &amp; run" in html  # the recipe's description
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    # the per-query tables hold every query that changed, with its text
    assert "Gained most" in html and "Lost most" in html


def test_report_package_imports_no_system():
    """medadapt.report is neutral: no import of a system package, at module or function level."""
    files = sorted((PACKAGE / "report").glob("*.py"))
    assert len(files) >= 5
    for path in files:
        bad = sorted(m for m in medadapt_imports(path) if m.startswith(SYSTEMS))
        assert not bad, f"{path.name} imports {bad}"


def test_per_query_ndcg_hand_computed():
    from medadapt.report import per_query_ndcg

    qrels = {"a": {"d1": 1}, "b": {"d1": 2, "d2": 1}, "c": {"d3": 1}, "d": {"d4": -2, "d5": 1}}
    run = {"a": {"d9": 0.9, "d1": 0.5}, "b": {"d2": 0.9, "d1": 0.8}, "d": {"d5": 0.1, "d4": 0.9}}
    got = per_query_ndcg(qrels, run)
    assert math.isclose(got["a"], 1 / math.log2(3), rel_tol=1e-6)  # relevant at rank 2
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    assert math.isclose(got["b"], (1 / math.log2(2) + 2 / math.log2(3)) / ideal, rel_tol=1e-6)
    assert got["c"] == 0.0  # missing from the run
    assert math.isclose(got["d"], 1 / math.log2(3), rel_tol=1e-6)  # grade -2 counts as non-relevant


def test_missing_pieces_become_notes(run_dir, tmp_path):
    from medadapt.cache import EmbeddingCache
    from medadapt.report import build_report

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "baseline_metrics.json").unlink()
    (copy / "metrics.json").write_text("{not json")
    log = json.loads((copy / "train_log.json").read_text())
    del log["expert_load"], log["routing_stats"]
    (copy / "train_log.json").write_text(json.dumps(log))
    # the recipe's data moved away: a note, not an error
    recipe = (copy / "recipe.yaml").read_text()
    (copy / "recipe.yaml").write_text(recipe.replace(str(run_dir.parent / "beir"), str(tmp_path / "gone")))
    out = build_report(copy, tmp_path / "r.html", cache=EmbeddingCache(tmp_path / "cache"),
                       show_progress=False)
    html = out.read_text(encoding="utf-8")
    assert "baseline_metrics.json is missing" in html
    assert "metrics.json cannot be read" in html
    assert "is not found from the current folder: pass --data DIR" in html
    assert "No expert load to show: train_log.json holds none" in html
    assert "<img " in html and 'id="fig-loss"' in html  # what can be shown still is


def test_not_a_run_folder_is_one_error_and_writes_nothing(tmp_path, run_dir):
    from typer.testing import CliRunner

    from medadapt.cli import app

    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    runner = CliRunner()
    cases = [
        ([str(tmp_path / "plain")], "is not a medadapt run folder (no recipe.yaml or train_log.json)"),
        ([str(tmp_path / "missing")], "is not a folder"),
        ([str(run_dir), "--data", str(run_dir.parent / "beir"), "--split", "dev"], "has no split 'dev'"),
    ]
    for args, message in cases:
        out = tmp_path / "r.html"
        result = runner.invoke(app, ["report", *args, "--output", str(out), "-q"])
        assert result.exit_code == 1, result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.output
        assert "Traceback" not in result.output
        assert not out.exists()
        assert not list(tmp_path.glob(".r.html.*"))  # no temporary file left


def test_cli_writes_the_page_into_the_run_folder(run_dir, tmp_path):
    from typer.testing import CliRunner

    from medadapt.cli import app

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    result = CliRunner().invoke(app, ["report", str(copy), "--cache-dir", str(run_dir.parent / "cache"), "-q",
                                      "--top", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"report written to {copy / 'report.html'}"
    html = (copy / "report.html").read_text(encoding="utf-8")
    assert "Gained most (top 1)" in html and "Lost most (top 1)" in html
    assert oct((copy / "report.html").stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # the user's mode


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------------------- real browser
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _DevTools:
    """Chromium's DevTools protocol over ``--remote-debugging-pipe`` (fd 3 in, fd 4 out, NUL-separated
    JSON): enough to open a page, collect console / log events and evaluate an expression."""

    def __init__(self, exe: str, profile: Path) -> None:
        import fcntl

        a, self.w = os.pipe()
        self.r, b = os.pipe()
        r_in, w_out = fcntl.fcntl(a, fcntl.F_DUPFD, 10), fcntl.fcntl(b, fcntl.F_DUPFD, 10)
        os.close(a)
        os.close(b)
        cmd = ["bash", "-c", f'exec "$0" "$@" 3<&{r_in} 4>&{w_out} {r_in}<&- {w_out}>&-', exe, *_FLAGS,
               f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(cmd, pass_fds=(r_in, w_out), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(r_in)
        os.close(w_out)
        self.buf, self.next_id, self.events = b"", 0, []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(deadline)
            if m.get("id") == self.next_id:
                assert "error" not in m, (method, m["error"])
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        for e in self.events:
            if e.get("method") == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m

    def _recv(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from chromium")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - the browser may be gone already
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.w)
        os.close(self.r)


def _open_in_chromium(exe: str, profile: Path, page: Path) -> dict:
    """Load ``page``; return its images' ``[complete, naturalWidth, naturalHeight]``, its title and every
    console / log message of level warning or error."""
    browser = _DevTools(exe, profile)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        browser.wait_event("Page.loadEventFired")

        def evaluate(expression: str):
            return browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                session=session)["result"]["value"]

        images = json.loads(evaluate("JSON.stringify(Array.from(document.images, "
                                     "i => [i.complete, i.naturalWidth, i.naturalHeight]))"))
        title = evaluate("document.title")
        time.sleep(0.5)  # late log entries (e.g. a blocked resource) arrive after the load event
        evaluate("1")
        problems = []
        for e in browser.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                problems.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
            elif method == "Runtime.exceptionThrown":
                problems.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                problems.append(f"log ({p['entry'].get('source')}): {p['entry'].get('text')}")
        return {"images": images, "title": title, "problems": problems}
    finally:
        browser.close()


@pytest.mark.skipif(_chromium() is None or shutil.which("bash") is None,
                    reason="no chromium on PATH (Debian: apt-get install -y chromium); the browser check "
                           "of the report page needs it")
def test_page_opens_in_headless_chromium(report, tmp_path):
    exe = _chromium()
    seen = _open_in_chromium(exe, tmp_path / "profile", report)
    assert seen["title"] == "medadapt run report: med-moe-embed-tiny"
    assert len(seen["images"]) == 6
    for complete, width, height in seen["images"]:
        assert complete and width > 0 and height > 0
    assert seen["problems"] == []

    # the check can fail: a page with a script (blocked by the same policy) and a broken image is caught
    bad = tmp_path / "bad.html"
    bad.write_text(report.read_text(encoding="utf-8").replace(
        "</body>",
        '<img src="data:image/png;base64,AAAA" alt="broken"><script>console.error(1)</script></body>'),
        encoding="utf-8")
    seen = _open_in_chromium(exe, tmp_path / "profile2", bad)
    assert [w for _, w, _ in seen["images"]].count(0) == 1
    assert any("Content Security Policy" in p for p in seen["problems"]), seen["problems"]
