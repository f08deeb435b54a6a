"""``amp-backends check MODULE:FACTORY``: build a model from a factory function and print the precision check.

The check itself is `amp_backends.check_model`. The plan is applied first, so the factory builds the model under
its dtype policy, as a script calling ``auto_configure()`` at its top would; the current directory is importable, as
with ``python -m``. Exit status: 0 no error (warnings and notes are speed advice), 1 a finding of severity ``error``
(wrong or unstable numbers: a CI job can gate on it), 2 bad input (a factory that raises or returns no model too).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from typing import Any

import typer

from ..errors import AmpConfigError, FactoryError
from ..factory import EXAMPLE, build_model, load_factory, parse_factory
from ..model_check.shapes import parse_input_shape, shape_options
from .typer_app import fail, number_option, with_overrides

PROG = "amp-backends check"
__all__ = ["check_command", "parse_input_shape"]


@with_overrides()
def check_command(
    target: str = typer.Argument(..., metavar="MODULE:FACTORY",
                                 help=f"A function that builds a Keras model with no arguments, such as {EXAMPLE}."),
    batch_size: int | None = number_option(None, "--batch-size", "--batch_size", prog=PROG, example=64, metavar="N",
                                           help="The training batch size (checks Dense rows; default: not checked)."),
    json_output: bool = typer.Option(False, "--json",
                                     help="Print JSON (schema: amp_backends/schemas/check.schema.json)."),
    seq_len: int | None = number_option(
        None, "--seq-len", prog=PROG, example=128, metavar="N",
        help="Set every open input dimension after the batch (a sequence length) to N."),
    input_shape: str | None = typer.Option(
        None, "--input-shape", metavar="SHAPE",
        help="One example's input shape, without the batch: 64x64x3, or name=128,other=128 for named inputs."),
    prepare: bool = typer.Option(False, "--prepare",
                                 help="Apply the layer plan first (amp_backends.prepare_model: the softmax head and "
                                      "the plan's float32 layers), as the Trainer and a script calling prepare_model "
                                      "do."),
    device: str | None = typer.Option(None, "--device", metavar="NAME",
                                      help="Check the model as a device of the catalogue would run it (h100, a100; "
                                           "the list: amp_backends.known_devices()) instead of this machine."),
    overrides: Any = None,
) -> None:
    """Build a model from MODULE:FACTORY under the plan and check it for what makes mixed precision slow or wrong.

    Exits 1 when a finding is an error (wrong or unstable numbers), 0 otherwise; --prepare checks the model with its
    layer plan applied, as it trains."""
    try:  # the factory's form and the shapes, before TensorFlow starts
        parse_factory(target)
        given_shapes = shape_options(seq_len, input_shape)
    except (FactoryError, ValueError) as exc:
        fail(PROG, exc)
    from ..tf_import import import_tensorflow, quiet_tensorflow_logs

    import_tensorflow(quiet_tensorflow_logs())  # TensorFlow's start-up noise filtered, as in the other commands
    from ..configure import auto_configure, configure_for_device

    try:  # a catalogue device: its plan and dtype policy, nothing else of it applied to this machine
        plan = (configure_for_device(device, **overrides) if device is not None
                else auto_configure(**overrides, verbose=False))
    except AmpConfigError as exc:
        fail(PROG, exc)
    # with --json, stdout is the JSON alone: what the factory prints (model.summary()) goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if json_output else contextlib.nullcontext()
    try:
        with quiet:
            factory = load_factory(target)
    except FactoryError as exc:
        fail(PROG, exc)
    try:
        with quiet:
            model = build_model(factory, target)
    except FactoryError as exc:
        if exc.__cause__ is not None:  # the factory raised: its traceback, above the message
            traceback.print_exception(exc.__cause__)
        fail(PROG, exc)
    from ..model_check import check_model
    from ..model_check.shapes import in_flag_words, refuse_unknown_names, shapes_with_sequence_length

    try:
        if input_shape is not None:
            refuse_unknown_names(model, given_shapes, input_shape)
        inputs = (given_shapes if given_shapes is not None
                  else shapes_with_sequence_length(model, seq_len) if seq_len is not None else None)
        with quiet:  # (a model's call may print as it is traced)
            if prepare:
                from ..prepare import prepare_model

                prepare_model(model, plan, inputs=inputs, measure_float32=False)
            result = check_model(model, plan=plan, batch_size=batch_size, inputs=inputs)
    except (TypeError, ValueError, RuntimeError) as exc:
        said = in_flag_words(input_shape, exc, model) if input_shape is not None else str(exc)
        if not getattr(model, "built", True) and input_shape is None and seq_len is None:  # (the fix said inputs=)
            said += (" On this command line: --input-shape SHAPE (one example's shape without the batch, such as "
                     "--input-shape 28x28x1) builds it.")
        fail(PROG, said)
    if json_output:
        typer.echo(result.to_json())
    else:
        result.render_text()
    if result.of_severity("error"):
        if not prepare and not json_output and any(f.code == "final-activation" for f in result.of_severity("error")):
            typer.echo("note: the model was checked as the factory built it; --prepare checks it with the layer plan "
                       "applied, as prepare_model and the Trainer apply it before training", err=True)
        raise typer.Exit(1)
