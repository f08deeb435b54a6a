"""Every number a command takes: a bad one ends the command with the library's message (the flag, what was
received, what is expected, a fix) and exit status 2, before any work; a good one reaches the command."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from amp_backends.commands.cli import get_app

CASES = [
    (["train", "mnist"], "--batch_size", "0", "an integer >= 1", "mnist"),
    (["train", "mnist"], "--batch-size", "-5", "an integer >= 1", "mnist"),
    (["train", "gan"], "--epochs", "0", "an integer >= 1", "gan"),
    (["train", "mnist"], "--epochs", "two", "an integer >= 1", "mnist"),
    (["train", "mnist"], "--max-steps", "0", "an integer >= 1", "mnist"),
    (["train", "mnist"], "--log-every", "-1", "an integer >= 1", "mnist"),
    (["train", "mnist"], "--checkpoint-every", "1.5", "an integer >= 1", "mnist"),
    (["train", "mnist"], "--steps-per-call", "0", "an integer >= 1", "mnist"),
    (["train", "mnist"], "--seed", "-1", "an integer >= 0", "mnist"),
    (["train", "mnist"], "--lr", "-0.1", "a number >= 0", "mnist"),
    (["train", "mnist", "--data", "missing.npz"], "--lr", "nan", "a number >= 0", "mnist"),
    (["train", "mnist"], "--cluster-timeout", "0", "a number >= 1", "mnist"),
    (["check", "amp_backends.models:mnist_cnn"], "--batch-size", "0", "an integer >= 1", "amp-backends check"),
    (["check", "amp_backends.models:mnist_cnn"], "--seq-len", "0", "an integer >= 1", "amp-backends check"),
    (["audit", "amp_backends.models:mnist_cnn"], "--steps", "0", "an integer >= 1", "amp-backends audit"),
    (["bench"], "--samples", "0", "an integer >= 1", "bench"),
    (["bench"], "--mnist-batch", "-5", "an integer >= 1", "bench"),
    (["bench"], "--epochs", "0", "an integer >= 1", "bench"),
    (["bench", "--models", "nothing"], "--reps", "-3", "an integer >= 1", "bench"),
]


@pytest.mark.parametrize("command, flag, value, expected, prog", CASES)
def test_a_bad_number_gets_the_librarys_message_and_exit_2(command, flag, value, expected, prog):
    result = CliRunner().invoke(get_app(), [*command, flag, value])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    if command[0] == "train" and flag == "--batch-size":
        flag = "--batch_size"  # the tutorials' spelling, the option's first name
    message = f"{prog}: error: {flag} must be {expected}. Received: {flag} {value}. Fix: pass {expected}, such as "
    assert message in text, text
    assert "Input should be" not in text and "Traceback" not in text


def test_a_good_number_reaches_the_command(monkeypatch):
    from amp_backends.commands import train_command as train

    seen = {}
    monkeypatch.setattr(train, "run_example", lambda name, fn, parsed, flags: seen.update(parsed, flags=flags))
    app = get_app()
    monkeypatch.setattr(app, "registered_groups", [])  # rebuild train's commands with run_example replaced
    app.add_typer(train.train_app(), name="train")
    result = CliRunner().invoke(app, ["train", "mnist", "--batch_size", "32", "--lr", "1e-3", "--max-steps", "7",
                                      "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert (seen["batch_size"], seen["lr"], seen["max_steps"], seen["seed"], seen["epochs"]) == (32, 1e-3, 7, 0, 1)
    assert isinstance(seen["batch_size"], int) and isinstance(seen["lr"], float)
    assert seen["flags"]["batch_size"] == ("--batch_size", "--batch-size")
    assert seen["flags"]["policy"] == ("--policy",)


def test_deterministic_runs_one_op_at_a_time_from_tensorflows_start(monkeypatch):
    """``gan --synthetic --deterministic`` differed run to run on a CPU after a dozen steps: TensorFlow ran a step's
    independent ops concurrently, which reorders its sums. The flag now sets one op at a time before TensorFlow
    starts (read only then)."""
    import amp_backends.tf_import as tf_import
    from amp_backends.commands import train_command

    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "unset")
    monkeypatch.delenv("TF_NUM_INTEROP_THREADS")  # (given back as it was after the test)
    monkeypatch.setattr(tf_import, "import_tensorflow", lambda *args, **kwargs: None)
    seen = []
    train_command.run_example("gan", lambda opts: seen.append(os.environ.get("TF_NUM_INTEROP_THREADS")),
                              {"deterministic": True})
    assert seen == ["1"]


def test_a_trainer_error_says_the_keywords_it_names_as_the_commands_flags():
    """The trainer's errors name its keywords; on the command line each is said as its flag, once, and a plain word
    that is also an option's name (data, seed) is not taken for it."""
    from amp_backends.commands.train_command import _as_flags

    flags = {"batch_size": ("--batch_size", "--batch-size"), "epochs": ("--epochs",), "data": ("--data",),
             "max_steps": ("--max-steps",), "log_every": ("--log-every",), "progress": ("--progress/--no-progress",)}
    message = "The data has 9 samples. Fix: lower batch_size, or pass epochs=4 and max_steps=8 (--max-steps)."
    assert _as_flags(message, flags) == " (On this command line: batch_size is --batch_size; epochs is --epochs.)"
    assert _as_flags("The data has 9 samples.", flags) == ""
    assert _as_flags("lower batch_size (--batch-size)", flags) == ""  # (said by another of its flags)
    assert _as_flags("the run's log_every_n", flags) == ""  # (a longer word holding the keyword)
    assert _as_flags("pass progress=False", flags) == " (On this command line: progress is --progress.)"


def test_the_version_is_printed_and_nothing_else_runs():
    from amp_backends.version import __version__

    result = CliRunner().invoke(get_app(), ["--version"])
    assert result.exit_code == 0 and result.output == f"amp-backends {__version__}\n", result.output
