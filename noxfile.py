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

Both test sessions run the tests in a worker process per core (pytest-xdist's ``-n auto``, at most 4: each
worker starts its own TensorFlow) and list their 25 slowest tests. Arguments after ``--`` replace the default
pytest arguments (``python3 -m nox -s intel -- -q -x tests/backends/intel/test_intel.py`` runs in one process).
"""

from pathlib import Path

import nox

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: nox and pytest bring tomli
    import tomli as tomllib

nox.options.sessions = ["lint", "tests", "intel"]
nox.options.reuse_existing_virtualenvs = True

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
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6", "mypy==2.4.1", *DOCS_STACK, *SITE_TEST_STACK)
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    # the suite's conftest.py needs the package and TensorFlow, which this session does not install
    session.run("pytest", "-q", "-ra", "-p", "no:cacheprovider", "--noconftest", "tests/test_site_browser.py")


@nox.session
def tests(session: nox.Session) -> None:
    session.install(".[test]")
    session.run("pytest", "--durations=25", *(session.posargs or ["-q", "-ra", *WORKERS]),
                env={"AMP_EXPECT_INSTALL": "wheel", "TF_CPP_MIN_LOG_LEVEL": "2"})


@nox.session(python="3.11")
def intel(session: nox.Session) -> None:
    session.install(*ITEX_STACK, "pytest>=8", "pytest-xdist>=3.5", "matplotlib>=3.7",
                    "jsonschema>=4.18")
    session.install("-e", ".", *ITEX_STACK)
    session.run("python", "-m", "amp_backends.info")
    session.run("pytest", "--durations=25", *(session.posargs or ["-q", "-ra", "-m", "intel", *WORKERS]),
                env={"AMP_EXPECT_INSTALL": "editable", "TF_CPP_MIN_LOG_LEVEL": "2"})
