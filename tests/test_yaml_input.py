"""The YAML input policy (medadapt.yaml_input): every hostile or broken YAML document a recipe, a ``--set`` value,
an accelerate config or a run folder's recipe.yaml can hold is one ConfigError ``file:line: ...``, in well
under two seconds, before anything is validated; ordinary YAML (anchors reused a few times, merge keys, a BOM)
still loads."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from medadapt.errors import ConfigError
from medadapt.recipes import load_recipe
from medadapt.yaml_input import MAX_ALIAS_VALUES, MAX_DEPTH, MAX_YAML_BYTES, load_yaml, read_yaml

HEAD = "kind: moe\nname: t\nmodel: {backbone: minilm}\ndata: {path: medmini}\nhead: {kind: moe}\n"  # 5 lines


def _bomb_under_branches() -> str:
    """The issue's recipe: aliases nested 8 deep under ``branches:``, 9-fold each (9**9 leaves expanded)."""
    lines = ["branches:", "  - kind: hyrec_lexical", "    a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"    a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return HEAD + "\n".join(lines) + "\n"


def _mapping_bomb() -> str:
    lines = ["eval:", "  expected:", "    m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9}"]
    lines += [f"    m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(9))}}}" for i in range(1, 9)]
    return HEAD + "\n".join(lines) + "\n"


def _alias_chain(n: int) -> str:
    """Each anchor one level deeper than the last: small in values, deep once expanded."""
    return HEAD + "eval:\n  expected:\n    x0: &x0 [1]\n" + "".join(
        f"    x{i}: &x{i} [*x{i - 1}]\n" for i in range(1, n))


def _deep_block(n: int) -> str:
    return HEAD + "eval:\n  expected:\n" + "".join(f"{'  ' * (i + 2)}- \n" for i in range(n))


def _alias_line(text: str, line: int) -> bool:
    return "*" in text.splitlines()[line - 1]


# (case, recipe text, expected message after "<file>:<line>: " (a regex), the line: a number or a check)
CASES = [
    ("alias bomb under branches", _bomb_under_branches(),
     rf"aliases expand to more than {MAX_ALIAS_VALUES:,} values \(an alias bomb\?\); write the values out",
     _alias_line),
    ("alias bomb of mappings", _mapping_bomb(), (r"aliases expand to more than 10,000 values \(an alias bomb\?\); "
     r"write the values out"), _alias_line),
    ("alias inside its own anchor", HEAD + "eval:\n  also: &a [*a]\n",
     r"alias \*a inside its own anchor \(a cyclic document\)", 7),
    ("deep flow nesting", HEAD + "eval: {expected: " + "[" * 20_000 + "\n",
     rf"nested more than {MAX_DEPTH} levels deep", 6),
    ("deep block nesting", _deep_block(100), rf"nested more than {MAX_DEPTH} levels deep", 5 + MAX_DEPTH + 1),
    ("deep through aliases", _alias_chain(70), r"nested more than 64 levels deep \(aliases expanded\)",
     _alias_line),
    ("5,000-digit integer", HEAD + "training: {epochs: " + "9" * 5000 + "}\n",
     (r"cannot read 9{20}\.\.\.9{10} \(5000 characters\) as int: Exceeds the limit \(4300 digits\) for integer "
     r"string conversion: value has 5000 digits"), 6),
    ("impossible date", HEAD + "description: 2024-13-45\n", (r"cannot read '2024-13-45' as timestamp: month must "
     r"be in 1\.\.12"), 6),
    ("lone surrogate escape", HEAD + 'description: "a \\ud800 b"\n',
     r"\\ud800 is a lone surrogate, not a character \(text must be valid Unicode\)", 6),
    ("escape beyond Unicode", HEAD + 'description: "\\UFFFFFFFF"\n', r"invalid YAML \(.+\)", 6),
    ("control character", HEAD + "description: a\x07b\n",
     r"invalid YAML \(control character U\+0007 is not allowed\)", 6),
    ("syntax error", HEAD + "training: [unclosed\n", r"invalid YAML \(expected ',' or '\]', but got '<stream end>'\)",
     7),
    ("tab indentation", HEAD + "training:\n\tlr: 1\n", (r"invalid YAML \(found character '\\t' that cannot start "
     r"any token\)"), 7),
    ("duplicate top-level key", HEAD + "name: u\n",
     r"duplicate key 'name' \(also on line 2\); YAML would keep only the last one", 6),
    ("duplicate nested key", HEAD + "training:\n  lr: 1.0e-3\n  epochs: 2\n  lr: 1.0e-2\n",
     r"duplicate key 'lr' \(also on line 7\); YAML would keep only the last one", 9),
    ("duplicate flow-mapping key", HEAD + "loss: {temperature: 0.05, temperature: 0.1}\n",
     r"duplicate key 'temperature' \(also on line 6\); YAML would keep only the last one", 6),
    ("duplicate key after a merge", HEAD + "training:\n  <<: {lr: 1.0e-3}\n  lr: 2.0e-3\n  lr: 3.0e-3\n",
     r"duplicate key 'lr' \(also on line 8\); YAML would keep only the last one", 9),
]


@pytest.mark.parametrize("text, message, line", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_or_broken_yaml_is_one_error_with_file_and_line(tmp_path, text, message, line):
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    before = path.read_bytes()
    start = time.process_time()  # this process's CPU time: other jobs on the machine do not count
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert time.process_time() - start < 2.0
    msg = str(info.value)
    assert "\n" not in msg
    head, _, rest = msg.partition(": ")
    assert head.startswith(f"{path}:"), msg
    found = int(head.rsplit(":", 1)[1])
    assert (line(text, found) if callable(line) else found == line), msg
    assert re.fullmatch(message, rest), msg
    assert path.read_bytes() == before


def test_the_issues_alias_bomb_is_under_a_kilobyte_and_would_expand_to_hundreds_of_millions():
    text = _bomb_under_branches()
    assert len(text.encode()) < 1000 and text.count("*a") == 72  # 9 ** 9 leaves once expanded


@pytest.mark.parametrize("text", [b"kind: moe\nname: caf\xe9\n", b"kind: moe\n\xff\xfe\n"], ids=["latin-1", "bom16"])
def test_bytes_that_are_not_utf8(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=rf"^{path}:2: not valid UTF-8 \(byte offset \d+\); save it as UTF-8$"):
        load_recipe(path)


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + "description: " + "x" * MAX_YAML_BYTES + "\n")
    with pytest.raises(ConfigError, match=rf"^{path}: larger than 65,536 bytes"):
        load_recipe(path)


def test_anchors_reused_a_few_times_merge_keys_and_a_bom_still_load(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("\ufeff" + HEAD + "training: &t {lr: 1.0e-3, epochs: 2}\n"
                    "eval:\n  metrics: &m [ndcg@10, mrr@10]\n  also:\n"
                    "    - &s {data: medmini, split: test, label: a}\n"
                    "    - {<<: *s, label: b}\n"
                    "    - {<<: *s, label: c, split: dev}\n", encoding="utf-8")
    recipe = load_recipe(path)
    assert [(a.label, a.split) for a in recipe.eval.also] == [("a", "test"), ("b", "test"), ("c", "dev")]
    assert recipe.eval.metrics == ["ndcg@10", "mrr@10"] and recipe.training.lr == 1e-3


def test_aliases_just_under_the_bound_load_and_share_one_object():
    text = "a: &a [" + ", ".join(["1"] * 999) + "]\nb: [" + ", ".join(["*a"] * 9) + "]\n"  # 9 x 1,000 values
    data, _ = load_yaml(text, "x.yaml")
    assert len(data["b"]) == 9 and all(item is data["a"] for item in data["b"])
    with pytest.raises(ConfigError, match=r"^x\.yaml:2: aliases expand to more than 10,000 values"):
        load_yaml(text.replace("*a]", "*a, *a, *a]"), "x.yaml")  # 11 x 1,000


def test_read_yaml_leaves_a_missing_file_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_yaml(tmp_path / "none.yaml")


@pytest.mark.parametrize("text, message", [
    ("num_processes: 2\nnum_processes: 4\n", r"acc\.yaml:2: duplicate key 'num_processes' \(also on line 1\)"),
    ("num_processes: " + "[" * 1000 + "\n", r"acc\.yaml:1: nested more than 64 levels deep"),
    (_bomb_under_branches(), r"acc\.yaml:\d+: aliases expand to more than 10,000 values"),
])
def test_accelerate_configs_go_through_the_same_policy(tmp_path, text, message):
    from medadapt.plan import read_accelerate_config

    path = tmp_path / "acc.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_accelerate_config(path)


def test_a_run_folders_recipe_goes_through_the_same_policy(tmp_path):
    from medadapt.report.run_folder import read_run

    (tmp_path / "recipe.yaml").write_text(_bomb_under_branches())
    (tmp_path / "train_log.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"recipe\.yaml:\d+: aliases expand to more than 10,000 values"):
        read_run(tmp_path)


def test_the_cli_prints_one_line(tmp_path):
    from typer.testing import CliRunner

    from medadapt.cli import app

    path = tmp_path / "r.yaml"
    path.write_text(_bomb_under_branches())
    start = time.process_time()
    result = CliRunner().invoke(app, ["train", str(path), "--output", str(tmp_path / "run")])
    assert time.process_time() - start < 5.0
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"error: {path}:") and "aliases expand to more than 10,000 values" in lines[0]
    assert not (tmp_path / "run").exists()
    assert Path(path).read_text() == _bomb_under_branches()
