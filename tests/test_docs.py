"""The documentation is checked like code: every page's code blocks run, the generated parts are current, and
every public name, command, option, environment variable, error class and finding code has its place.

Each page's ``python`` blocks run in order in one fresh namespace, in a process of their own (they set global
TensorFlow state: ``auto_configure()`` sets the Keras dtype policy); the pages run side by side. ``bash``,
``text`` and ``console`` blocks are shown, not run; a ``json`` block must parse, and a ``diff`` block's new side
must compile. The site itself (``mkdocs build --strict``) is built by nox's ``lint`` session.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest
from warm_python import run_python

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = DOCS / "generated"
README = ROOT / "README.md"

SHOWN = {"bash", "text", "console"}  # shown, never run
CHECKED = {"python", "json", "diff"}  # run, parsed, compiled
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.M)

SETUP_COMMANDS = [
    "python3 -m pip install '.[examples]' && python3 -m amp_backends.examples.mnist --digits --epochs 3 --lr 0.001 "
    "--log-every 10",
    "python3 -m pip install nox uv && python3 -m nox",
]
CODE_WIDTH = 88  # the widest code line a page shows: a code block fits the page at a desktop width
CONTINUATION = re.compile(r" \\\n[ \t]*")  # a bash line ending in " \" goes on in the next line


def pages() -> list[Path]:
    """Every page of the site (the generated parts are read through the pages that include them)."""
    return sorted(p for p in DOCS.rglob("*.md") if GENERATED not in p.parents)


def text_of(page: Path) -> str:
    """The page as the site shows it: its ``--8<--`` snippets included."""
    text = page.read_text(encoding="utf-8")
    return SNIPPET.sub(lambda m: (GENERATED / m.group(1)).read_text(encoding="utf-8"), text)


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, code, line) of each fenced block."""
    text = text_of(page)
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@cache
def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the code blocks --------------------------------------------------------------------------------------------

def test_every_block_says_its_language_and_is_run_or_shown():
    wrong = [f"{name(p)}:{line}: ```{lang or '(none)'}" for p in [*pages(), README] for lang, _, line in blocks(p)
             if lang not in SHOWN | CHECKED]
    assert not wrong, ("code blocks must be ```python (run by this test), ```json, ```diff (checked) or "
                       "```bash/```text/```console (shown): " + ", ".join(wrong))


RUNNER = r"""
import json, sys, traceback
page, blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for number, (code, line) in enumerate(blocks, 1):
    try:
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    except BaseException:
        print(f"\n{page}: python block {number} (line {line}) failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def python_pages() -> list[Path]:
    return [p for p in pages() if any(lang == "python" for lang, _, _ in blocks(p))]


def run_page(page: str, scratch: Path) -> subprocess.CompletedProcess:
    """The page's python blocks, in order, in a process of their own (forked from a warm interpreter: `run_python`)
    and the folder ``scratch`` (what a page writes — runs/, checkpoints — stays out of the checkout). (Under
    pytest-xdist the pages are spread over the workers.)"""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "AMP_CACHE_DIR": os.path.join(scratch, "cache"),
           "AMP_AUTOTUNE_CACHE": os.path.join(scratch, "autotune.json"), "PYTHONWARNINGS": "ignore",
           "TMPDIR": str(scratch)}  # (a page's own tempfile.mkdtemp() too)
    path = next(p for p in python_pages() if name(p) == page)
    code = [(c, line) for lang, c, line in blocks(path) if lang == "python"]
    return run_python(["-c", RUNNER], cwd=scratch, env=env, input=json.dumps([page, code]), timeout=240)


@pytest.mark.tensorflow
@pytest.mark.parametrize("page", [name(p) for p in python_pages()])
def test_the_python_blocks_of_each_page_run_in_order(page, tmp_path):
    try:
        done = run_page(page, tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{page}: its python blocks ran past 240 s: keep a page's examples small (tiny epochs, steps)")
    assert done.returncode == 0, f"{page}: python blocks failed (exit {done.returncode}):\n{done.stderr[-4000:]}"


def test_no_code_line_is_wider_than_a_code_block():
    """Every fenced block of every page as the site shows it (snippets included) and of README.md: a line
    longer than CODE_WIDTH would need scrolling sideways. Wrap bash with ` \\` continuations, python inside
    its brackets, and a program's output where the terminal would."""
    wide = [f"{name(p)}:{line + n}: {len(text)} characters: {text[:60]}..." for p in [*pages(), README]
            for _, code, line in blocks(p) for n, text in enumerate(code.splitlines(), 1) if len(text) > CODE_WIDTH]
    assert not wide, f"code lines over {CODE_WIDTH} characters (line numbers count snippets in):\n" + "\n".join(wide)


def test_the_wrapped_commands_are_the_recorded_ones():
    """docs/generate.py wraps each results file's command to fit a code block: bash reads the same words."""
    gen = generator()
    commands = [json.loads(p.read_text(encoding="utf-8")).get("command", "")
                for p in [*(ROOT / "results").glob("*.json"), *(ROOT / "results").glob("zoo-*/*/zoo.json")]]
    assert any(len(c) > gen.CODE_WIDTH for c in commands)
    for command in filter(None, commands):
        lines = gen._shell_lines(command)
        assert max(map(len, lines)) <= gen.CODE_WIDTH and gen.shell_words("\n".join(lines)) == shlex.split(command)
    assert gen.CODE_WIDTH == CODE_WIDTH
    # a value longer than a line: quoted pieces, each line but the last ending in a bare backslash
    assert gen._shell_lines("python -m x --note " + shlex.quote("a word " * 40)) == [
        "python -m x \\",
        "  --note 'a word a word a word a word a word a word a word a word a word a word a '\\",
        "'word a word a word a word a word a word a word a word a word a word a word a word a '\\",
        "'word a word a word a word a word a word a word a word a word a word a word a word a '\\",
        "'word a word a word a word a word a word '"]


def test_no_table_cell_shows_an_escape():
    """A pipe inside a code span in a table is the table's text: escaped (``\\|``) it would show the backslash."""
    shown = [f"{name(p)}: {span}" for p in pages() for row in text_of(p).splitlines() if row.startswith("|")
             for span in re.findall(r"`[^`]*`", row) if "\\|" in span]
    assert not shown, "\n".join(shown)


def test_json_blocks_parse_and_diff_blocks_compile():
    for page in pages():
        for lang, code, line in blocks(page):
            if lang == "json":
                json.loads(code)
            elif lang == "diff":
                new = "\n".join(ln[1:] for ln in code.splitlines() if not ln.startswith("-"))
                ast.parse(new, filename=f"{name(page)}:{line}")


def test_the_readme_keeps_the_set_up_commands_and_runs_only_what_the_site_runs():
    found = blocks(README)
    # a block may wrap its command with ` \` line continuations: CI copies it as it is
    bash = [CONTINUATION.sub(" ", code).strip() for lang, code, _ in found if lang == "bash"]
    for command in SETUP_COMMANDS:
        assert command in bash, (f"README.md must keep this set-up command, alone in a ```bash block (lines may "
                                 f"end in ` \\` and go on in the next):\n{command}")
    site = {code for p in pages() for lang, code, _ in blocks(p) if lang == "python"}
    for lang, code, line in found:
        if lang == "python":
            assert code in site, f"README.md:{line}: a python block must be a page's own (which this test runs)"


# -- generated parts --------------------------------------------------------------------------------------------

def test_the_generated_pages_are_current():
    stale = [n for n, text in generator().generate().items()
             if not (GENERATED / n).exists() or (GENERATED / n).read_text(encoding="utf-8") != text]
    assert not stale, (f"docs/generated/{', '.join(stale)} differ from what the code and results/ give now. "
                       "Fix: run `python docs/generate.py` and commit what it writes")


def test_the_readmes_support_matrix_is_the_generated_one():
    """The README copies the matrix (GitHub shows no snippets): it had lost the ITEX run's versions."""
    generated = (GENERATED / "support-matrix.md").read_text(encoding="utf-8").split("\n", 1)[1].strip()
    assert generated in (ROOT / "README.md").read_text(encoding="utf-8"), (
        "README.md's support matrix differs from docs/generated/support-matrix.md. Fix: copy the generated one")


def test_every_generated_part_is_shown_on_a_page_and_every_chart_exists():
    included = {m.group(1) for p in pages() for m in SNIPPET.finditer(p.read_text(encoding="utf-8"))}
    assert set(generator().PAGES) <= included, set(generator().PAGES) - included
    charts = re.findall(r"\]\(assets/([^)]+)\)", (GENERATED / "benchmarks.md").read_text(encoding="utf-8"))
    assert charts and all((DOCS / "assets" / c).exists() for c in charts), charts
    assert len(charts) == len(generator().chart_data())  # one chart per device


def test_the_options_page_holds_the_overrides_table():
    from amp_backends.request import overrides_markdown

    assert overrides_markdown() in (GENERATED / "options.md").read_text(encoding="utf-8")


def test_every_environment_variable_the_package_reads_is_documented():
    page = text_of(DOCS / "reference" / "options.md")
    missing = sorted(v for v in generator().environment_variables_read() if f"`{v}`" not in page)
    assert not missing, f"document these in ENVIRONMENT of docs/generate.py (then run it): {missing}"


def test_every_command_is_on_the_command_line_page():
    page = text_of(DOCS / "reference" / "cli.md")
    commands = generator().cli_commands()
    assert {"amp-backends info", "amp-backends check", "amp-backends audit", "amp-backends bench",
            "amp-backends train mnist", "amp-backends train gan"} <= set(commands)
    assert all(f"## `{c}`" in page for c in commands)


# -- names, errors, codes ---------------------------------------------------------------------------------------

def test_every_public_name_is_in_the_api_reference():
    import amp_backends

    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    documented = {m.group(1).rsplit(".", 1)[-1] for m in re.finditer(r"^::: (amp_backends[\w.]*)$", page, re.M)}
    missing = sorted(set(amp_backends.__all__) - documented)
    assert not missing, f"docs/reference/api.md has no '::: amp_backends.NAME' for {missing}"


def test_the_backend_interface_is_in_the_api_reference():
    """A backend author's names (`amp_backends.backend_api`): each class of the interface has its entry."""
    from amp_backends import backend_api

    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    documented = {m.group(1).rsplit(".", 1)[-1] for m in re.finditer(r"^::: (amp_backends[\w.]*)$", page, re.M)}
    classes = {name for name in backend_api.__all__ if isinstance(getattr(backend_api, name), type)
               and not issubclass(getattr(backend_api, name), Exception)}
    missing = sorted(classes - documented)
    assert not missing, f"docs/reference/api.md has no '::: amp_backends....NAME' for {missing}"


def test_the_home_pages_figures_are_its_results_files():
    """The home page quotes two results files; each figure is theirs (they were typed, and had drifted)."""
    text = " ".join((DOCS / "index.md").read_text(encoding="utf-8").split())
    zen1 = json.loads((ROOT / "results" / "cpu-policy-zen1.json").read_text())["results"]
    f32, bf16 = zen1["float32"]["median"], zen1["mixed_bfloat16"]["median"]
    assert f"{f32 / bf16:.1f}x slower ({bf16} against float32's {f32} img/s" in text
    h200 = {r["config"]: r["img_per_s"] for r in json.loads(
        (ROOT / "results" / "bench-h200-mnist" / "bench.json").read_text())["results"] if r["model"] == "mnist"}
    fastest = max((c for c in h200 if "+" in c or c in ("fp32", "TF32")), key=h200.get)
    assert fastest == "fp16 fixed+XLA" and "float16 with a fixed loss scale plus XLA is the fastest" in text
    assert f"({h200[fastest] / 1000:.0f}k img/s against float32's {h200['fp32'] / 1000:.0f}k)" in text
    gains = [h200[f"{c}+XLA"] / h200[c] for c in ("TF32", "fp16 fixed", "fp16 dynamic", "bf16")]
    assert f"up {min(gains):.1f}-{max(gains):.1f}x" in text, gains


def test_no_docstring_line_starts_a_markdown_block_quote():
    """A docstring line beginning with ``>`` renders as a quote in the API reference, the ``>`` lost."""
    quoted = [f"{path.relative_to(ROOT)}:{n}" for path in sorted([*(ROOT / "amp_backends").rglob("*.py"),
                                                                 *(ROOT / "backends").rglob("*.py")])
              for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
              if re.match(r"\s+> ", line)]
    assert not quoted, f"a docstring line starts with '>': {quoted}"


def troubleshooting_entries() -> dict[str, str]:
    """``### `name``` heading -> its text."""
    text = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    parts = re.split(r"^### `([^`]+)`.*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_error_class_and_finding_code_has_a_troubleshooting_entry_with_cause_and_fix():
    from amp_backends import errors

    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)
               and v.__module__ == errors.__name__}
    codes = generator().finding_codes()
    assert {"final-activation", "mask-overflow", "float32-compute"} <= codes["check"]  # the scan sees the rules
    assert {"float32-kernels", "eigen-bfloat16"} <= codes["audit"]
    entries = troubleshooting_entries()
    wanted = classes | codes["check"] | codes["audit"]
    missing = sorted(wanted - set(entries))
    assert not missing, f"docs/troubleshooting.md needs a '### `NAME`' entry (cause and fix) for {missing}"
    thin = sorted(n for n in wanted if "**Cause**" not in entries[n] or "**Fix**" not in entries[n])
    assert not thin, f"these troubleshooting entries lack a **Cause** or a **Fix**: {thin}"


# -- the site's shape -------------------------------------------------------------------------------------------

def test_the_navigation_reaches_the_quickstart_exit_codes_and_mpiexec_in_one_click():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    entries = dict(re.findall(r"^\s*- ([^:\n]+): (\S+\.md)$", nav, re.M))
    assert "#" not in "".join(entries.values())
    assert "quickstart" in text_of(DOCS / entries["Keras fit quickstart"]).lower()
    assert "## Exit codes" in text_of(DOCS / entries["Faults and exit codes"])
    several = text_of(DOCS / entries["Several machines (TF_CONFIG, mpiexec, srun)"])
    assert "mpiexec -np" in several and "\n### mpiexec (Open MPI, MPICH)\n" in several
    listed = {DOCS / p for p in entries.values()}
    assert set(pages()) == listed, f"pages outside the navigation, or missing: {set(pages()) ^ listed}"

