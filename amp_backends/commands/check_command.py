"""``amp-backends check MODULE:FACTORY``: build a model from a factory function and print the precision check.

The check itself is `amp_backends.check_model`. The plan is applied first, so the factory builds the model under
its dtype policy, as a script calling ``auto_configure()`` at its top would; the current directory is importable, as
with ``python -m``. Exit status: 0 no error (warnings and notes are speed advice), 1 a finding of severity ``error``
(wrong or unstable numbers: a CI job can gate on it), 2 bad input (a factory that raises or returns no model too).
"""

from __future__ import annotations

import traceback
from typing import Any

import typer

from ..errors import AmpConfigError, FactoryError
from ..factory import EXAMPLE, build_model, load_factory, parse_factory
from .typer_app import fail, number_option, with_overrides

PROG = "amp-backends check"


def parse_input_shape(text: str) -> Any:
    """One example's shape: ``"64x64x3"`` -> ``(None, 64, 64, 3)``; ``"token_ids=128,padding_mask=128"`` -> a dict of
    such shapes; ValueError when malformed."""
    def dims(part: str) -> tuple[int | None, ...]:
        try:
            values = tuple(int(d) for d in part.strip().lower().split("x"))
        except ValueError:
            values = ()
        if not values or any(d < 1 for d in values):
            raise ValueError(
                f"expected one example's shape as positive sizes joined by 'x', such as 28x28x1 or 128. Received: "
                f"{part!r} in --input-shape {text!r}. Fix: leave the batch out, it comes from --batch-size")
        return (None, *values)

    if "=" not in text:
        return dims(text)
    shapes: dict[str, tuple[int | None, ...]] = {}
    for item in text.split(","):
        name, sep, shape = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"expected name=SHAPE pairs separated by commas, such as token_ids=128,padding_mask=128. "
                             f"Received: {item!r} in --input-shape {text!r}. Fix: name every input")
        shapes[name.strip()] = dims(shape)
    return shapes


def _example_shape(model: Any) -> str:
    """``--input-shape`` as the model's own inputs would be given (an open dimension as 128)."""
    from ..keras_compat import input_structure

    struct = input_structure(model)
    leaves = struct.items() if isinstance(struct, dict) else [(None, struct)] if struct is not None else []
    shapes = {name: "x".join(str(d or 128) for d in leaf.shape[1:]) or "1" for name, leaf in leaves
              if getattr(leaf, "shape", None)}
    if len(shapes) == 1 and None in shapes:
        return shapes[None]
    return ",".join(f"{k}={v}" for k, v in shapes.items()) if shapes else "128"


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
    device: str | None = typer.Option(None, "--device", metavar="NAME",
                                      help="Check the model as a device of the catalogue would run it (h100, a100; "
                                           "the list: amp_backends.known_devices()) instead of this machine."),
    overrides: Any = None,
) -> None:
    """Build a model from MODULE:FACTORY under the plan and check it for what makes mixed precision slow or wrong.

    Exits 1 when a finding is an error (wrong or unstable numbers), 0 otherwise."""
    try:
        parse_factory(target)  # its form, before TensorFlow starts
    except FactoryError as exc:
        fail(PROG, exc)
    from ..tf_import import import_tensorflow, quiet_tensorflow_logs

    import_tensorflow(quiet_tensorflow_logs())  # TensorFlow's start-up noise filtered, as in the other commands
    from ..configure import auto_configure, configure_for_device

    try:  # a catalogue device: its plan and dtype policy, nothing else of it applied to this machine
        plan = (configure_for_device(device, **overrides) if device is not None
                else auto_configure(**overrides, verbose=False))
    except AmpConfigError as exc:
        fail(PROG, exc)
    try:
        factory = load_factory(target)
    except FactoryError as exc:
        fail(PROG, exc)
    try:
        model = build_model(factory, target)
    except FactoryError as exc:
        if exc.__cause__ is not None:  # the factory raised: its traceback, above the message
            traceback.print_exception(exc.__cause__)
        fail(PROG, exc)
    from ..model_check import check_model
    from ..model_check.shapes import shapes_with_sequence_length

    if seq_len is not None and input_shape is not None:
        fail(PROG, "expected at most one of --seq-len and --input-shape, received both. Fix: give --seq-len N for "
                   "the open dimensions, or the full shapes with --input-shape")
    try:
        inputs = (parse_input_shape(input_shape) if input_shape is not None
                  else shapes_with_sequence_length(model, seq_len) if seq_len is not None else None)
        result = check_model(model, plan=plan, batch_size=batch_size, inputs=inputs)
    except (TypeError, ValueError, RuntimeError) as exc:
        if input_shape is not None and str(exc).startswith("inputs= "):  # said in this command line's words
            fail(PROG, f"--input-shape {input_shape} {str(exc)[len('inputs= '):].split(' Fix: ')[0]} Fix: give one "
                       f"example's shape without the batch, such as --input-shape {_example_shape(model)}")
        fail(PROG, exc)
    if json_output:
        typer.echo(result.to_json())
    else:
        result.render_text()
    if result.of_severity("error"):
        raise typer.Exit(1)
