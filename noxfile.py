"""Test environments (nox).

* ``tests``: the primary stack — the interpreter running nox, TensorFlow 2.21 (Keras 3) — with the
  package installed as a wheel (``pip install .``); the whole suite.
* ``intel``: Python 3.11, TensorFlow 2.15.1 (Keras 2) and Intel Extension for TensorFlow 2.15.0.0 with
  its CPU backend, the package installed in editable mode (``pip install -e .``); runs the tests marked
  ``intel`` (``-m intel``: what that stack changes — probes, plan, apply, the Keras 2 paths, ITEX, the
  trainer's loss scaling, checkpoints and resume, the precision check), with ITEX really loaded.
  ``tests/test_markers.py`` keeps the marker honest.

* ``lint``: ruff over the whole tree, mypy over the whole package (configured in ``pyproject.toml``) and the
  documentation site built with ``mkdocs build --strict`` (``mkdocs.yml``; the ``docs`` extra): a broken link,
  a missing page or snippet, or a docstring the API reference cannot render fails it. The site goes to
  ``site/`` (git-ignored); ``mkdocs serve`` shows it while writing. Then ``tests/test_site_browser.py`` (the
  ``site-test`` extra) loads every page in headless Chromium — layout at a desktop and a phone width, console
  errors, the search — and writes screenshots to ``site-screenshots/amp_backends-site/`` (git-ignored); it
  skips, saying why, where Chromium or chromium-driver is missing. No TensorFlow needed.

``python3 -m nox`` runs all three; ``python3 -m nox -s tests`` one.

Where uv is installed beside nox (``python3 -m pip install nox uv``), nox makes the sessions' environments with it:
the same requirements, installed in a fraction of pip's time (``pip install '.[test]'`` took 52.8 s and uv 17.7 s,
empty caches, the changelog says where), byte-compiled at install (``UV_COMPILE_BYTECODE``: each test process then
reads TensorFlow's compiled modules instead of compiling them). Without uv, nox uses virtualenv and pip. Each session
ends by logging its seconds, environment and installs included.

Both test sessions run the tests in a worker process per core (pytest-xdist's ``-n auto``, at most 4: each
worker starts its own TensorFlow) and list their 25 slowest tests. Arguments after ``--`` replace the default
pytest arguments (``python3 -m nox -s intel -- -q -x tests/backends/intel/test_intel.py`` runs in one process).
"""

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import nox

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: nox and pytest bring tomli
    import tomli as tomllib

nox.options.sessions = ["lint", "tests", "intel"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv|virtualenv"  # uv where it is installed, else virtualenv and pip
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")  # uv's installs byte-compiled, as pip's are

_last_end = [time.monotonic()]  # when the previous session ended (nox runs them one after another)


def timed(session_function: Callable[[nox.Session], None]) -> Callable[[nox.Session], None]:
    """The session, ending (passed or failed) with a log of the seconds since the previous session ended: its own,
    its environment and installs included."""

    @functools.wraps(session_function)
    def run(session: nox.Session) -> None:
        try:
            session_function(session)
        finally:
            now = time.monotonic()
            session.log(f"session {session.name}: {now - _last_end[0]:.0f} s")
            _last_end[0] = now

    return run

# The documentation site's libraries: pyproject.toml's ``docs`` extra (without the package: mkdocstrings reads the
# source, and the generated pages are committed).
EXTRAS = tomllib.loads(Path(__file__).with_name("pyproject.toml").read_text(encoding="utf-8"))["project"][
    "optional-dependencies"]
DOCS_STACK = EXTRAS["docs"]
SITE_TEST_STACK = EXTRAS["site-test"]  # the site in a browser: Selenium and pytest
ITEX_STACK = ["tensorflow==2.15.1", "intel-extension-for-tensorflow[cpu]==2.15.0.0"]
# a worker per core, each with its own TensorFlow; idle workers take queued tests from busy ones
WORKERS = ["-n", "auto", "--maxprocesses", "4", "--dist", "worksteal"]


@nox.session
@timed
def lint(session: nox.Session) -> None:
    """ruff, mypy, the documentation site built strict, and the site in headless Chromium."""
    session.install("ruff==0.17.6", "mypy==2.4.1", *DOCS_STACK, *SITE_TEST_STACK)
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    # the suite's conftest.py needs the package and TensorFlow, which this session does not install
    session.run("pytest", "-q", "-ra", "-p", "no:cacheprovider", "--noconftest", "tests/test_site_browser.py")


@nox.session
@timed
def tests(session: nox.Session) -> None:
    """The whole suite under TensorFlow 2.21 (Keras 3), the package installed as a wheel."""
    session.install(".[test]")
    session.run("pytest", "--durations=25", *(session.posargs or ["-q", "-ra", *WORKERS]),
                env={"AMP_EXPECT_INSTALL": "wheel", "TF_CPP_MIN_LOG_LEVEL": "2"})


@nox.session(python="3.11")
@timed
def intel(session: nox.Session) -> None:
    """The tests marked intel under TensorFlow 2.15 (Keras 2) with ITEX, the package installed in editable mode."""
    session.install(*ITEX_STACK, "pytest>=8", "pytest-xdist>=3.5", "matplotlib>=3.7",
                    "jsonschema>=4.18")
    session.install("-e", ".", *ITEX_STACK)
    session.run("python", "-m", "amp_backends.info")
    session.run("pytest", "--durations=25", *(session.posargs or ["-q", "-ra", "-m", "intel", *WORKERS]),
                env={"AMP_EXPECT_INSTALL": "editable", "TF_CPP_MIN_LOG_LEVEL": "2"})
