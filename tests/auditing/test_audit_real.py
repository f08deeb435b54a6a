"""Real audits of the MNIST CNN, each in its own child process (a few seconds each), and the command."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NEUTRAL_CWD
from schema_check import assert_valid
from warm_python import subprocess_module

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
MNIST = "amp_backends.models:mnist_cnn"


@pytest.fixture(autouse=True)
def warm_audit_children(monkeypatch):
    """An audit run in this process starts its child (``python -m amp_backends.auditing.child ...``) forked from an
    interpreter that has imported TensorFlow (`warm_python`), with the child's own environment: the audit's code —
    the child, its oneDNN records, the runner's waiting, timeout and errors — runs as it does, spared the child's
    TensorFlow import. (The command's signal test starts the command itself, in a process of its own.)"""
    from amp_backends.auditing import runner

    monkeypatch.setattr(runner, "subprocess", subprocess_module())


def audit_app():
    """The ``audit`` command's typer app, as ``amp-backends audit`` builds it, for `typer.testing.CliRunner`."""
    from amp_backends.commands.audit_command import audit_command
    from amp_backends.commands.typer_app import make_app

    app = make_app()
    app.command()(audit_command)
    return app


def cpu_has_bf16() -> bool:
    from amp_backends.backends.cpu import probe_cpu

    return probe_cpu().native_bf16


def itex_bf32() -> bool:
    """Whether this machine's plan runs float32 matmuls in ITEX's BF32 math mode (ITEX loaded, an AMX CPU)."""
    import amp_backends

    return amp_backends.plan_for(environ={}).vendor_setting("ITEX_FP32_MATH_MODE") == "BF32"


def keras3() -> bool:
    import tensorflow as tf

    return str(getattr(tf.keras, "__version__", "2")).startswith("3")


@pytest.mark.intel
def test_the_auto_plan_runs_its_convolutions_in_bf16_kernels_with_the_output_layer_a_float32_island(monkeypatch):
    if not cpu_has_bf16():
        pytest.skip("this CPU has no bf16 instructions: the auto plan is float32 here, nothing runs in bf16 kernels")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    from amp_backends import audit

    d = audit(MNIST, batch_size=32, steps=2).to_dict()
    assert d["plan"]["compute_dtype"] == "bfloat16" and d["outside_onednn"] is None
    assert_valid("audit", d)
    conv = d["by_kind"]["convolution"]
    assert conv["dtypes"].get("bfloat16", 0) > 0.5
    assert max(conv["units"], key=conv["units"].get) in ("AVX512-BF16", "AMX")
    assert d["time_share_by_dtype"]["bfloat16"] > 0.5
    if itex_bf32():  # ITEX's BF32 math mode (AMX) runs float32 matmuls, the head's too, on the bf16 tiles
        assert d["float32_islands"] == [] and d["time_share_by_dtype"] == {"bfloat16": 1.0}
    else:
        assert any(i["layers"] == ["mnist_cnn/dense_1"] for i in d["float32_islands"])
    assert not [w for w in d["warnings"] if "convolution" in w["what"]]


def test_under_policy_float32_no_time_is_in_reduced_precision(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    from amp_backends import audit

    d = audit(MNIST, batch_size=32, steps=1, policy="float32").to_dict()
    assert d["plan"]["policy"] == "float32"
    if d["outside_onednn"]:  # a CPU where TensorFlow leaves oneDNN off (Zen 1): nothing is claimed
        assert d["time_share_by_dtype"] == {}
    else:
        assert set(d["time_share_by_dtype"]) == {"float32"}
    assert d["float32_islands"] == [] and not [w for w in d["warnings"] if "bfloat16" in w["what"]]


def test_with_onednn_opts_off_the_kernels_ran_outside_onednn(monkeypatch):
    if not keras3():
        # checked on TF 2.15.1 + ITEX 2.15.0.0 (Zen 4): with it set to 0, ITEX still runs its oneDNN convolutions
        pytest.skip("TF_ENABLE_ONEDNN_OPTS does not turn ITEX's oneDNN kernels off under TF 2.15 + ITEX")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    from amp_backends import audit

    d = audit(MNIST, batch_size=8, steps=1, policy="float32").to_dict()
    assert "ran outside oneDNN (Eigen)" in d["outside_onednn"] and d["time_share_by_dtype"] == {}


def test_the_command_prints_json_and_refuses_bad_targets():
    from typer.testing import CliRunner

    app = audit_app()
    runner = CliRunner()
    result = runner.invoke(app, [MNIST, "--batch-size", "16", "--steps", "1", "--policy", "float32", "--json"],
                           env={**os.environ})
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout[result.stdout.index("{"):])
    assert d["model"] == "mnist_cnn" and "time_share_by_dtype" in d
    assert_valid("audit", d)
    bad = runner.invoke(app, ["mymodels.py"])
    assert bad.exit_code == 2 and "expected MODULE:FACTORY" in bad.output
    bad = runner.invoke(app, [MNIST, "--policy", "mixed_float64"])
    assert bad.exit_code == 2 and "mixed_float64" in bad.output
    # a request --strict refuses on this machine: it was the child's traceback, exit 1, in AMP_* words
    from amp_backends import plan_for
    from amp_backends.errors import UnsupportedRequestError

    try:
        plan_for(tf32="on", strict=True)
        return  # (this machine runs TF32: a GPU, or ITEX's BF32 on an AMX CPU; no CPU of this session does)
    except UnsupportedRequestError:
        pass
    strict = runner.invoke(app, [MNIST, "--steps", "1", "--tf32", "on", "--strict"])
    said = " ".join(strict.output.split())
    assert strict.exit_code == 2 and "tf32=on (from --tf32)" in said and "Traceback" not in said, said


def audit_child(command: subprocess.Popen, deadline: float) -> int | None:
    """The pid of the audit's child process of ``command``, once it runs (``None``: not yet)."""
    assert command.poll() is None, command.communicate()[0][-2000:]
    assert time.time() < deadline, "the audit's child process never started"
    for pid in Path(f"/proc/{command.pid}/task/{command.pid}/children").read_text().split():
        try:
            if b"amp_backends.auditing.child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        except OSError:  # (it ended meanwhile)
            continue
    return None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_command_alone_stops_its_child_and_says_so(signum):
    """``kill -INT <pid>`` or ``kill <pid>`` reaches the command but not its child (a terminal's Ctrl-C reaches
    both): SIGINT exited 130 without a word, SIGTERM ended the command at once (-15) and left the child training.
    Now either stops the child, says so in one line and exits 130 or 143."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    # SIGINT at its default, as in a terminal, even where the tests run as a background job (which ignores it)
    proc = subprocess.Popen([sys.executable, "-m", "amp_backends", "audit", MNIST, "--steps", "100000",
                             "--batch-size", "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=NEUTRAL_CWD, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        while (child := audit_child(proc, deadline)) is None:
            time.sleep(0.02)
        time.sleep(0.5)  # (the command waits on its child by now, as it does for the rest of the audit)
        os.kill(proc.pid, signum)  # the command alone, not its process group
        out, _ = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever is left of its session (a child that outlived it)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, out[-2000:]
    said = (f"amp-backends audit: stopped: interrupted ({name}) before the audit of {MNIST} finished: its child "
            "process was stopped, nothing was measured.")
    assert out.strip().splitlines()[-1:] == [said] and "Traceback" not in out, out[-2000:]
    assert not Path(f"/proc/{child}").exists(), "the audit's child outlived the command"


OBSERVED_TRAINING = """
import json
import numpy as np
import tensorflow as tf
import amp_backends
from amp_backends.models import mnist_cnn

plan = amp_backends.auto_configure(policy="float32", verbose=False)
model = mnist_cnn()
trainer = amp_backends.Trainer(amp_backends.classifier_updates(model, tf.keras.optimizers.SGD(0.01)), plan,
                               batch_size=16, log_every=100, progress=False, check_models=False, audit=(2, 4))
print("BEFORE FIT", flush=True)
trainer.fit(np.random.rand(96, 28, 28, 1).astype("float32"), np.random.randint(0, 10, 96), max_steps=5)
print("AFTER FIT", flush=True)
result = trainer.audit.result
print("AUDIT_JSON " + json.dumps(result.to_dict() if result else None))
"""


def test_the_trainer_observer_audits_its_window_when_onednn_verbose_was_set_at_start(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "observed.py"
    script.write_text(OBSERVED_TRAINING)
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    # oneDNN's records during fit are taken off standard output (kept for the window, dropped elsewhere);
    # what Python prints around and during fit still comes through
    during = out.stdout.split("BEFORE FIT", 1)[1].split("AFTER FIT", 1)[0]
    assert "onednn_verbose" not in during and "AFTER FIT" in out.stdout
    line = next(line for line in out.stdout.splitlines() if line.startswith("AUDIT_JSON "))
    d = json.loads(line[len("AUDIT_JSON "):])
    assert d is not None and d["steps"] == 2 and d["plan"]["policy"] == "float32"
    assert d["batch_size"] == 16  # the trainer's (it said "batch None")
    assert_valid("audit", d)
    if not d["outside_onednn"]:
        assert set(d["time_share_by_dtype"]) == {"float32"} and "convolution" in d["by_kind"]


DEPTHWISE_FACTORY = '''
import tensorflow as tf


def build():
    keras = tf.keras
    inp = keras.Input((24, 24, 32))
    h = keras.layers.Conv2D(64, 3, padding="same", name="stem")(inp)
    h = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", name="dw_strided")(h)
    h = keras.layers.Conv2D(64, 1, name="pointwise")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inp, keras.layers.Dense(10, activation="softmax", name="predictions")(h), name="dwnet")
'''


def test_the_audit_runs_the_model_as_training_prepares_it_and_its_float32_layers_are_as_planned(
        monkeypatch, tmp_path):
    if not cpu_has_bf16():
        pytest.skip("this CPU has no bf16 instructions: the auto plan is float32 here, no layer is kept in float32")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    from amp_backends import audit
    from amp_backends.configure import plan_for

    if not any(k.layer == "DepthwiseConv2D" for k in plan_for().float32_layers):
        pytest.skip("this machine's plan keeps no depthwise convolution in float32 (AMX, Arm, ITEX or oneDNN off)")
    (tmp_path / "dwmodels.py").write_text(DEPTHWISE_FACTORY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    d = audit("dwmodels:build", batch_size=16, steps=2).to_dict()
    assert d["plan"]["compute_dtype"] == "bfloat16"
    assert set(d["plan"]["float32_layers"]) == {"dwnet/dw_strided", "dwnet/predictions"}  # the layer plan
    kept = [i for i in d["float32_islands"] if "dwnet/dw_strided" in i["layers"]]
    assert kept and all(i["planned"] for i in kept)  # it ran in float32, as the layer plan keeps it
    # never told to undo the plan
    assert not [w for w in d["warnings"] if "dw_strided" in w["what"] or "convolution time ran in float32" in w["what"]]


AUDIT_MODELS = """
import tensorflow as tf

K, L = tf.keras, tf.keras.layers


def four_dense():
    # four hidden Dense layers with the same 64x64 kernel, the third pinned to float32
    x = K.Input((64,))
    h = L.Dense(64, activation="relu", name="a")(x)
    h = L.Dense(64, activation="relu", name="b")(h)
    h = L.Dense(64, activation="relu", name="pinned", dtype="float32")(h)
    h = L.Dense(64, activation="relu", name="c")(h)
    return K.Model(x, L.Dense(10, dtype="float32", name="head")(h), name="four")


def tiny_gpt2():
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=1000, num_layers=1, num_heads=2, hidden_dim=64,
                                             intermediate_dim=128, max_sequence_length=16, name="gpt2")
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None, name="lm")
"""


@pytest.mark.parametrize("factory, island", [
    ("four_dense", "four/pinned"),  # not "ambiguous" over the three bfloat16 layers of its kernel shape
    ("tiny_gpt2", "lm/gpt2/token_embedding"),  # the tied head's matmul has no kernel: it was "unmatched"
])
def test_a_float32_island_is_named_by_the_layer_whose_call_ran_it(tmp_path, monkeypatch, factory, island):
    if not cpu_has_bf16():
        pytest.skip("this CPU has no bf16 instructions: the auto plan is float32 here, with no float32 islands")
    if factory == "tiny_gpt2":
        if not keras3():
            pytest.skip("keras_hub needs Keras 3; this tf.keras is Keras 2")
        pytest.importorskip("keras_hub", reason="keras_hub is not installed (it needs Keras 3)")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    (tmp_path / "audit_models.py").write_text(AUDIT_MODELS)
    monkeypatch.chdir(tmp_path)
    from amp_backends import audit

    d = audit(f"audit_models:{factory}", batch_size=16, steps=1, warmup=1).to_dict()
    assert d["plan"]["compute_dtype"] == "bfloat16" and d["outside_onednn"] is None
    islands = {tuple(i["layers"]): i for i in d["float32_islands"]}
    assert islands[(island,)]["matched"] == "layer"
    assert all(i["matched"] == "layer" for i in islands.values()), islands
    if factory == "four_dense":  # and only the two float32 layers have float32 islands
        assert set(islands) == {("four/pinned",), ("four/head",)}


@pytest.mark.intel
def test_a_factory_the_child_cannot_import_or_that_raises_is_our_error_as_in_check(tmp_path, monkeypatch):
    """``audit nosuch:f`` ended with exit 1 and the child's traceback ("the audit's child process ... failed"),
    where ``check`` says what is wrong and exits 2: the child now reports the factory's error, and the audit raises
    it as a `FactoryError` (the command: exit 2), the factory's own traceback kept for a factory that raises."""
    from amp_backends import audit
    from amp_backends.errors import FactoryError

    (tmp_path / "audit_models.py").write_text("def boom():\n    raise ValueError('no weights here')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FactoryError, match="expected an importable module 'audit_nosuch_module'.*Fix: "):
        audit("audit_nosuch_module:f", steps=1)
    with pytest.raises(FactoryError) as err:
        audit("audit_models:boom", steps=1)
    text = str(err.value)
    assert text.startswith("audit_models.boom() raised ValueError: no weights here") and "Fix: " in text
    assert "The child's last lines:\nTraceback" in text and "raise ValueError('no weights here')" in text


def test_an_unbuilt_subclassed_model_is_our_error_naming_the_input_shape_fix(tmp_path, monkeypatch):
    """``audit mymods:unbuilt`` ended with the child's traceback and exit 1 ("cannot tell the input shape ...: build
    it with keras.Input"), not naming --input-shape, which audits it."""
    from amp_backends import audit
    from amp_backends.errors import AmpConfigError

    (tmp_path / "sub_models.py").write_text(
        "import tensorflow as tf\n\n\nclass Net(tf.keras.Model):\n    def __init__(self):\n        super().__init__()\n"
        "        self.d = tf.keras.layers.Dense(3)\n\n    def call(self, x):\n        return self.d(x)\n\n\n"
        "def unbuilt():\n    return Net()\n")
    monkeypatch.chdir(tmp_path)
    fix = r"--input-shape 8 \(audit\(\.\.\., input_shape=\(None, 8\)\)\)"  # (it said (8,): the batch goes first)
    with pytest.raises(AmpConfigError, match=r"has no input shape to audit it on .*Fix: .*" + fix):
        audit("sub_models:unbuilt", steps=1, warmup=1, batch_size=4)
    from amp_backends.errors import ModelCallError

    # a shape of another rank than the model takes: our error, as check says it (a RuntimeError with the child's
    # traceback before)
    with pytest.raises(ModelCallError, match=r"does not run on inputs of shape \(None,\)"):
        audit("sub_models:unbuilt", steps=1, warmup=1, batch_size=4, input_shape=(24,))


def test_a_sequence_longer_than_the_models_position_embedding_is_our_error_naming_the_layer(tmp_path, monkeypatch):
    """``audit distil --seq-len 64`` on a keras_hub backbone of max_sequence_length 32 ended with the child's
    traceback ("Paddings must be non-negative", exit 1), where ``check`` names the layer and exits 2."""
    pytest.importorskip("keras_hub")
    from amp_backends import audit
    from amp_backends.errors import ModelCallError

    (tmp_path / "hub_models.py").write_text(
        "import keras_hub\n\n\ndef distil():\n    return keras_hub.models.DistilBertBackbone(vocabulary_size=200, "
        "num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64, max_sequence_length=32)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelCallError, match=r"its layer '\S*position_embedding' \(PositionEmbedding\) raised.*Fix: "):
        audit("hub_models:distil", steps=1, warmup=1, batch_size=4, seq_len=64)


def test_another_machines_plan_is_audited_under_its_own_policy_and_says_so(tmp_path, monkeypatch):
    """audit(factory, plan_for(device="h100")) on a CPU: the child downgraded float16 to this CPU's choice, and the
    headline said "plan nvidia mixed_bfloat16", a plan that exists nowhere."""
    import amp_backends
    from amp_backends import audit

    if amp_backends.plan_for().backend != "cpu":
        pytest.skip("a machine with a GPU runs the H100's plan on its own backend")
    (tmp_path / "tiny.py").write_text("import tensorflow as tf\n\n\ndef tiny():\n    return tf.keras.Sequential("
                                      "[tf.keras.Input((8,)), tf.keras.layers.Dense(4)])\n")
    monkeypatch.chdir(tmp_path)
    h100 = amp_backends.plan_for(device="h100")
    result = audit("tiny:tiny", h100, steps=1, warmup=1, batch_size=4)
    assert (result.plan["backend"], result.plan["policy"]) == ("nvidia", h100.policy) == ("nvidia", "mixed_float16")
    assert any(f"this machine's cpu plan ({h100.policy}" in note for note in result.notes), result.notes


def test_a_layer_that_raises_in_any_dtype_is_our_error_naming_the_layer(tmp_path, monkeypatch):
    """It was a RuntimeError with the child's Keras traceback: the step's trace failed before the check was asked."""
    from amp_backends import audit
    from amp_backends.errors import ModelCallError

    (tmp_path / "folded.py").write_text(
        "import tensorflow as tf\n\n\ndef folded():\n    keras = tf.keras\n"
        "    return keras.Sequential([keras.Input((8,)), keras.layers.Lambda(lambda t: tf.reshape(t, (-1, 3)), "
        "name='fold'), keras.layers.Dense(3)], name='folded')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelCallError, match=r"its layer 'folded/fold' \(Lambda, .*Fix: make the function work"):
        audit("folded:folded", steps=1, warmup=1, batch_size=4)


def test_the_audit_trains_at_the_shapes_asked_for_and_says_the_shapes_it_trained_at(tmp_path, monkeypatch):
    """A model leaving its sequence length open was audited at 8 without a word, and the command had no way to
    give the length (``check`` had ``--seq-len`` and ``--input-shape``). The command's code runs here, its model in
    the audit's child (the command's own process is another test's: the signals test below)."""
    from typer.testing import CliRunner

    (tmp_path / "textmodels.py").write_text(
        "import tensorflow as tf\n\n\ndef build():\n"
        "    inp = tf.keras.Input((None,), dtype='int32', name='token_ids')\n"
        "    x = tf.keras.layers.Embedding(50, 16)(inp)\n"
        "    return tf.keras.Model(inp, tf.keras.layers.Dense(8)(x))\n")
    monkeypatch.chdir(tmp_path)  # (the model's module, relative to where the command runs)
    app = audit_app()

    def audit(*args):
        return CliRunner().invoke(app, ["textmodels:build", "--steps", "1", "--batch-size", "4", "--policy",
                                        "float32", *args], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})

    out = audit()
    assert out.exit_code == 0, out.output[-2000:]
    assert "inputs: (4, 8) int32 (the model leaves dimensions open: they were set to 8" in out.stdout
    out = audit("--seq-len", "24", "--json")
    assert out.exit_code == 0, out.output[-2000:]
    d = json.loads(out.stdout[out.stdout.index("{"):])
    assert_valid("audit", d)
    assert "inputs: (4, 24) int32" in d["notes"], d["notes"]
    out = audit("--input-shape", "24x3")
    assert out.exit_code == 2 and "--input-shape 24x3 gives an input of shape (None, 24, 3)" in out.stderr
    assert "Fix: give one example's shape without the batch, such as --input-shape 128" in out.stderr
    started = time.time()
    out = audit("--seq-len", "24", "--input-shape", "24")
    assert out.exit_code == 2 and "at most one of --seq-len and --input-shape" in out.stderr
    assert time.time() - started < 30  # refused before the child process builds anything


def test_audit_takes_the_shapes_in_python_and_refuses_bad_ones_before_anything_runs():
    from amp_backends import audit

    for kwargs, said in (({"seq_len": 8, "input_shape": (None, 8)}, "at most one of seq_len and input_shape"),
                         ({"seq_len": 0}, "seq_len must be a positive int"),
                         ({"input_shape": (None, "8")}, "input_shape takes an input's shape"),
                         ({"input_shape": "8y8"}, "positive sizes joined by 'x'"),
                         ({"input_shape": [(None, 8), (None, "4")]}, "a list or dict")):
        with pytest.raises(ValueError, match=said):
            audit("amp_backends.models:mnist_cnn", **kwargs)
