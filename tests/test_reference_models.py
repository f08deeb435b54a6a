"""The reference architectures of :mod:`amp_backends.zoo` through the whole library, as a user takes them.

A keras_hub BERT-like encoder and GPT-2-like causal LM, ``keras.applications`` MobileNetV3Small, ResNet50 and
EfficientNetB0 at a small input, an LSTM and a two-headed CNN with BatchNormalization — built from configs,
without weights — each go through the precision check (this machine's plan and an H100 plan from the device
catalogue, sized from their data), float8 preparation under a forced fp8 plan, the trainer and Keras ``fit``
with the plan's optimizer and compile arguments; then the mistakes a new user makes with them, each refused
with the library's own error. Batches of 4, two to four steps: quick on 2 cores.

Models needing keras_hub (Keras 3) skip under TensorFlow 2.15 + Keras 2 with :func:`amp_backends.zoo.unavailable`'s
reason; float8 needs Keras >= 3.3. The check reads models built once per session (conftest's ``zoo_models``); a
test that trains, compiles or prepares a model builds its own.
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.layer_plan import worth_measuring  # noqa: E402
from amp_backends import keras_compat as kc  # noqa: E402
from amp_backends import zoo  # noqa: E402
from amp_backends.errors import AmpWarning, InputError  # noqa: E402
from amp_backends.keras_compat import walk  # noqa: E402
from conftest import ZooModels, policy  # noqa: E402

pytestmark = pytest.mark.tensorflow

K = tf.keras
KERAS3 = (kc.keras_info(tf).generation or 2) >= 3
NAMES = ("bert", "gpt2", "mobilenet_v3", "resnet50", "efficientnet", "lstm", "two_heads")
BATCH = 8  # the check's batch: a multiple of every alignment but fp8's
STEP_BATCH = 4  # training: 2 to 4 steps of 4 samples
entry = ZooModels.entry


def data(name: str, n: int = BATCH, seed: int = 0):
    return entry(name).data(n, seed)


def here():
    """This machine's plan, applied."""
    return amp_backends.auto_configure(verbose=False)


def float32_head(model, plan) -> bool:
    """Whether the model's output layer computes its matmul in float32 under a mixed plan (the zoo's GPT-2 LM head)."""
    last = [layer for _, layer in walk(model, model.name) if type(layer).__name__ in ("Dense", "EinsumDense")][-1]
    return plan.policy != "float32" and tf.as_dtype(last.compute_dtype).name == "float32"


def codes(result, severity=None):
    return [f.code for f in result.findings if severity is None or f.severity == severity]


def dense_paths(model) -> set[str]:
    return {path for path, layer in walk(model, model.name) if type(layer).__name__ in ("Dense", "EinsumDense")}


def finite(values) -> bool:
    return all(math.isfinite(float(v)) for v in values)


# ------------------------------------------------------------------------------------ the precision check
def _common_check(model, plan, result, name):
    assert result.sized, result.headline()
    assert "unsized-model" not in codes(result) and "policy-mismatch" not in codes(result), result.render()
    assert codes(result, "error") == [], result.render()
    for code in ("output-dtype", "final-activation", "logits-dtype"):  # the zoo's outputs are float32
        assert code not in codes(result), result.render()
    assert {tf.as_dtype(t.dtype).name for t in tf.nest.flatten(model.outputs)} == {"float32"}
    assert result.summary.flops_per_image > 0 and result.batch_size == BATCH
    # every Dense/EinsumDense of the model has a float8 decision with a reason
    assert {layer.path for layer in result.fp8_layers} == dense_paths(model)
    assert all(layer.why for layer in result.fp8_layers)
    if name in ("bert", "gpt2"):  # attention's softmax is a finding only where it computes in reduced precision
        assert ("attention-softmax" in codes(result)) == (plan.policy != "float32"), result.render()
    if name == "gpt2" and float32_head(model, plan):
        # the float32 LM head is most of a small GPT-2's FLOPs: said as such, with the fix, not as a model built
        # before the plan
        (head,) = [f for f in result.findings if f.code == "float32-compute"]
        assert head.layer.endswith("lm_head") and head.severity == "warning" and head.flops_share > 0.5
        assert "dtype='float32'" in head.fix
    elif plan.policy != "float32":
        assert result.summary.reduced_precision_share > 0.9, result.render()


def skip_keras2_lstm(name: str) -> None:
    if name == "lstm" and not KERAS3:
        pytest.skip("Keras 2's LSTM runs its matmuls inside a while loop, which the check cannot size: only the "
                    "float32 output layer is counted there")


@pytest.mark.intel
@pytest.mark.parametrize("name", NAMES)
def test_check_under_a_cpu_plan(name, zoo_models, cpu_plan):
    """Under this machine's plan where it is a CPU plan of that kind, else the catalogue CPU's (conftest)."""
    skip_keras2_lstm(name)
    plan = cpu_plan
    model = zoo_models.shared(name, plan.policy)
    x, _ = data(name)
    result = amp_backends.check_model(model, inputs=x, plan=plan)
    assert result.plan["policy"] == plan.policy
    _common_check(model, plan, result, name)
    # on a CPU with AVX512-BF16 and no AMX the depthwise models have layers the plan keeps in float32, not yet
    # set (prepare_model, or the trainer, sets them)
    expected = ["float32-layers"] if worth_measuring(model, plan) else []
    assert codes(result, "warning") == (["float32-compute"] if name == "gpt2" and float32_head(model, plan)
                                        else expected)
    if expected:
        prepared = zoo_models.fresh(name, plan.policy)
        amp_backends.prepare_model(prepared, plan, measure_float32=False)
        assert codes(amp_backends.check_model(prepared, inputs=x, plan=plan), "warning") == []


@pytest.mark.parametrize("name", NAMES)
def test_check_under_an_h100_plan(name, zoo_models):
    skip_keras2_lstm(name)
    h100 = amp_backends.configure_for_device("h100")
    assert h100.backend == "nvidia" and h100.policy == "mixed_float16" and amp_backends.current_plan() is None
    model = zoo_models.shared(name, h100.policy)
    x, _ = data(name)
    result = amp_backends.check_model(model, plan=h100, inputs=x)
    assert result.plan["backend"] == "nvidia" and result.plan["compute_dtype"] == "float16"
    _common_check(model, h100, result, name)
    assert "emulated-policy" not in codes(result)
    if name in ("mobilenet_v3", "efficientnet"):
        assert "depthwise" in codes(result)  # no Tensor Core path for them
    if not (name == "gpt2" and float32_head(model, h100)):
        assert codes(result, "warning") == [], result.render()


def test_check_without_inputs_says_bert_is_unsized_and_how_to_fix_it(zoo_models):
    plan = here()
    model = zoo_models.shared("bert", plan.policy)
    result = amp_backends.check_model(model)
    assert not result.sized and result.findings[0].code == "unsized-model" and "inputs=" in result.findings[0].fix


def test_gpt2_with_the_real_vocabulary_is_told_to_pad_it():
    entry("gpt2")
    import keras_hub

    h100 = amp_backends.configure_for_device("h100")
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=50257, num_layers=1, num_heads=2, hidden_dim=64,
                                             intermediate_dim=128, max_sequence_length=32)
    logits = K.layers.Dense(50257, name="lm_head")(backbone.output)  # in float16: the misaligned logits GEMM
    model = K.Model(backbone.input, K.layers.Activation("linear", dtype="float32")(logits), name="gpt2_50257")
    ids = np.ones((BATCH, 32), "int32")
    result = amp_backends.check_model(model, plan=h100, inputs={"token_ids": ids, "padding_mask": ids})
    (vocab,) = [f for f in result.findings if f.code == "vocabulary-size"]
    assert vocab.severity == "warning" and "50257" in vocab.what and "50304" in vocab.fix


# ------------------------------------------------------------------------------------ float8
@pytest.mark.skipif(not KERAS3, reason="float8 layers need Keras >= 3.3; this tf.keras is Keras 2")
# (ResNet50's and EfficientNetB0's only Dense is the output layer, as MobileNetV3's: one of the three shows it)
@pytest.mark.parametrize("name", [n for n in NAMES if n not in ("resnet50", "efficientnet")])
def test_fp8_preparation_lists_every_dense_layer_and_the_quantized_ones_train(name):
    e = entry(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AmpWarning)
        plan = amp_backends.auto_configure(fp8="on", force=True, verbose=False)
    if not plan.fp8:
        pytest.skip(f"fp8 cannot be forced here: {plan.reasons.get('fp8')}")
    assert any("because force is on" in str(w.message) for w in caught)  # no fp8 arithmetic here: emulated
    model = e.build()  # under the forced plan's policy (applied)
    x, y = data(name, 16)  # sized at a batch of 16, fp8's alignment; trained on 4
    # (whether every layer in float32 trains faster is measured in test_float32_layers, not here)
    prep = amp_backends.prepare_model(model, plan, inputs=x, measure_float32=False)
    x, y = tf.nest.map_structure(lambda a: a[:STEP_BATCH], (x, y))
    assert [path for path, _, _ in prep.layers] and {path for path, _, _ in prep.layers} == dense_paths(model)
    assert all(why for _, _, why in prep.layers)
    assert set(prep.quantized) == {path for path, done, _ in prep.layers if done}
    layers = dict(walk(model, model.name))
    for path in prep.quantized:
        assert str(layers[path].dtype_policy.name).startswith("float8"), path
    for path, why in prep.skipped:  # kept: the first and last layers, and none for size (forced: waived)
        assert "too small" not in why and ("last layer" in why or "first layer" in why), (path, why)
    if name in ("bert", "gpt2"):  # attention projections and feed-forward layers, small ones included
        assert len(prep.quantized) >= 8 and any("feedforward" in path for path in prep.quantized)
    elif name == "two_heads":
        assert len(prep.quantized) == 1 and prep.quantized[0].startswith("two_heads/dense")  # the value head's hidden
    else:
        assert not prep.quantized  # their only Dense is the output layer
        return
    model.compile(optimizer=plan.wrap_optimizer(K.optimizers.Adam(1e-3)), loss=e.loss(), **plan.compile_kwargs())
    losses = [model.train_on_batch(x, y) for _ in range(2)]
    assert finite(tf.nest.flatten(losses)), losses


# ------------------------------------------------------------------------------------ the trainer
def two_heads_update(model, optimizer):
    """The two-headed model's own update: both heads' losses, BatchNormalization's statistics as state."""
    per_example = entry("two_heads").example_loss()

    def loss_fn(batch):
        x, y = batch
        pred = model(x, training=True)
        return per_example(y, tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), pred))

    return [amp_backends.Update("two_heads", loss_fn, [(model.trainable_variables, optimizer)],
                                state=model.non_trainable_variables)]


def updates_for(name, model):
    optimizer = K.optimizers.Adam(1e-3)
    if name == "two_heads":
        return two_heads_update(model, optimizer)
    return amp_backends.classifier_updates(model, optimizer, entry(name).loss())


HEAVY = ("mobilenet_v3",)  # 10-30 s to compile a training step on a busy 2-core CPU
# the light models take the same Keras 2 paths under TensorFlow 2.15 (session 'intel') at a fraction of the cost;
# EfficientNetB0's layers (depthwise convolutions, squeeze-and-excitation, BatchNormalization, swish) are
# MobileNetV3's, trained here in a third of its time (it is checked above, and the zoo trains it); ResNet50's
# (convolutions with BatchNormalization, residual adds) are the two-headed CNN's and MobileNetV3's, trained here
# in a fraction of its 20 s (it is checked and float8-prepared above)
TRAINED = [pytest.param(n, marks=pytest.mark.slow if n in HEAVY else pytest.mark.intel) for n in NAMES
           if n not in ("efficientnet", "resnet50")]
# Keras fit under the plan: the light models (MobileNetV3's layers train in the trainer test above, and Keras fit
# traces the same model's ~25,000 operations once more, without a code path of its own)
FIT = [p for p in TRAINED if p.values[0] not in HEAVY]


@pytest.mark.parametrize("name", TRAINED)
def test_trainer_trains_a_few_finite_steps(name, zoo_models):
    plan = here()
    model = zoo_models.fresh(name, plan.policy)
    x, y = data(name, 3 * STEP_BATCH, seed=1)
    # trains under the plan as it is: whether all-float32 is faster is a timing (test_float32_layers measures), which
    # here would let the machine's load pick the precision trained in, at the cost of two more compiled passes
    trainer = amp_backends.Trainer(updates_for(name, model), plan, batch_size=STEP_BATCH, progress=False, seed=0,
                                   measure_float32=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpWarning)  # (GPT-2's float32 head is a warning; said above)
        result = trainer.fit(x, y, max_steps=3)
    assert result.steps == 3 and sum(result.applied.values()) == 3 and not any(result.skipped.values())
    losses = [h[u] for h in result.history for u in h if u in result.last_losses]
    assert losses and finite(losses) and finite(result.last_losses.values())


@pytest.mark.intel
@pytest.mark.parametrize("name", ["two_heads", "lstm"])
def test_trainer_resumes_from_a_relative_checkpoint_directory(name, tmp_path, monkeypatch, zoo_models):
    plan = here()
    monkeypatch.chdir(tmp_path)
    x, y = data(name, 4 * STEP_BATCH, seed=2)

    def trainer():
        model = zoo_models.fresh(name, plan.policy)
        return model, amp_backends.Trainer(updates_for(name, model), plan, batch_size=STEP_BATCH, progress=False,
                                           seed=0, checkpoint_dir="runs/ck", checkpoint_every=2, check_models=False)

    first, t1 = trainer()
    t1.fit(x, y, max_steps=2)
    saved = [v.numpy() for v in first.weights]
    second, t2 = trainer()
    monkeypatch.chdir(tmp_path)
    assert t2.restore() == 2  # from runs/ck, relative to where the trainer was made
    for before, after in zip(saved, second.weights, strict=True):  # BatchNormalization's moving statistics included
        np.testing.assert_array_equal(before, after.numpy())
    result = t2.fit(x, y, max_steps=4, resume=True)
    assert result.steps == 4 and [h["step"] for h in result.history] == [3, 4]
    assert finite(result.last_losses.values())


# ------------------------------------------------------------------------------------ Keras fit
@pytest.mark.parametrize("name", FIT)
def test_keras_fit_with_the_plans_optimizer_and_compile_arguments(name, zoo_models):
    e = entry(name)
    plan = here()
    model = zoo_models.fresh(name, plan.policy)
    x, y = data(name, 2 * STEP_BATCH, seed=3)
    model.compile(optimizer=plan.wrap_optimizer(K.optimizers.Adam(1e-3)), loss=e.loss(), **plan.compile_kwargs())
    history = model.fit(x, y, batch_size=STEP_BATCH, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and finite(history.history["loss"])


# ------------------------------------------------------------------------------------ a new user's mistakes
def test_check_model_with_wrong_input_keys_for_bert_names_the_expected_ones(zoo_models):
    plan = here()
    model = zoo_models.shared("bert", plan.policy)
    ids = np.ones((BATCH, 64), "int32")
    with pytest.raises(ValueError) as err:
        amp_backends.check_model(model, inputs={"input_ids": ids, "attention_mask": ids})
    message = str(err.value)
    assert "token_ids" in message and "input_ids" in message and "Fix" in message


def test_bert_inputs_as_a_list_are_refused_with_the_names_it_takes(zoo_models):
    plan = here()
    model = zoo_models.shared("bert", plan.policy)
    x, _ = data("bert")
    as_list = [x["token_ids"], x["segment_ids"], x["padding_mask"]]
    with pytest.raises(ValueError, match=r"dict of named inputs .*padding_mask.*Fix: pass a dict"):
        amp_backends.check_model(model, inputs=as_list)  # was: a RuntimeError around Keras's traceback


def test_trainer_refuses_bert_features_under_other_names_before_any_step(zoo_models):
    plan = here()
    model = zoo_models.shared("bert", plan.policy)
    x, y = data("bert", STEP_BATCH)
    renamed = {"input_ids": x["token_ids"], "token_type_ids": x["segment_ids"], "attention_mask": x["padding_mask"]}
    trainer = amp_backends.Trainer(updates_for("bert", model), plan, batch_size=STEP_BATCH, progress=False,
                                   check_models=False)
    with pytest.raises(InputError, match=r"takes the inputs .*token_ids.*x lacks .*Fix"):
        trainer.fit(renamed, y, max_steps=1)  # was: Keras's ValueError from inside the traced step
    assert trainer.position.step == 0


@pytest.mark.intel
def test_two_heads_with_one_keras_loss_is_refused_with_the_fix(zoo_models):
    plan = here()
    model = zoo_models.fresh("two_heads", plan.policy)
    with pytest.raises(amp_backends.errors.AmpConfigError, match=r"2 outputs.*Fix: give loss= a function"):
        amp_backends.classifier_updates(model, K.optimizers.Adam())  # was: AttributeError inside the traced step
    with pytest.raises(amp_backends.errors.AmpConfigError, match=r"2 outputs.*Fix: give loss= a function"):
        amp_backends.classifier_updates(model, K.optimizers.Adam(), K.losses.sparse_categorical_crossentropy)  # too
    with pytest.raises(TypeError, match="several outputs"):
        amp_backends.classifier_updates(model, K.optimizers.Adam(), entry("two_heads").loss())  # compile's dict
    # the fix as said: one function over both outputs
    updates = amp_backends.classifier_updates(model, K.optimizers.Adam(), entry("two_heads").example_loss())
    x, y = data("two_heads", STEP_BATCH)
    result = amp_backends.Trainer(updates, plan, batch_size=STEP_BATCH, progress=False, check_models=False).fit(
        x, y, max_steps=1)
    assert finite(result.last_losses.values())


@pytest.mark.intel
def test_variable_length_padded_batches_are_refused_before_training(zoo_models):
    plan = here()
    model = zoo_models.fresh("lstm", plan.policy)
    lengths = [40, 64, 50, 64, 30, 64, 64, 20]
    rows = [np.arange(1, n + 1, dtype="int32") for n in lengths]
    ds = tf.data.Dataset.from_generator(lambda: ((r, np.int32(i % 2)) for i, r in enumerate(rows)),
                                        output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))
    ds = ds.padded_batch(2)  # batches of 40, 64, ... positions: the model takes 64
    trainer = amp_backends.Trainer(updates_for("lstm", model), plan, batch_size=4, progress=False, check_models=False)
    with pytest.raises(InputError) as err:
        trainer.fit(ds, max_steps=2)
    message = str(err.value)
    assert "variable length" in message and "padded_shapes=" in message and "Fix" in message
    fixed = ds.unbatch().padded_batch(4, padded_shapes=([64], []), drop_remainder=True)  # the fix, as said
    trainer = amp_backends.Trainer(updates_for("lstm", model), plan, batch_size=4, progress=False, check_models=False)
    assert finite(trainer.fit(fixed, max_steps=2).last_losses.values())


@pytest.mark.intel
@pytest.mark.parametrize("name", ["lstm", "gpt2"])
def test_labels_out_of_range_in_a_later_batch_stop_at_that_step(name, zoo_models):
    plan = here()
    model = zoo_models.fresh(name, plan.policy)
    x, y = data(name, 3 * STEP_BATCH, seed=4)
    y = y.copy()  # (GPT-2's labels are a view of its token ids)
    classes = 2 if name == "lstm" else zoo.VOCAB
    y[2 * STEP_BATCH + 1] = classes  # one past the model's classes (GPT-2: the whole row of next tokens)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(STEP_BATCH)
    weights = [v.numpy() for v in model.trainable_weights]
    trainer = amp_backends.Trainer(updates_for(name, model), plan, batch_size=STEP_BATCH, progress=False,
                                   check_models=False)
    with pytest.raises(InputError) as err:
        trainer.fit(ds, max_steps=3)
    message = str(err.value)  # (steps count from 0 in the message: the third batch is step 2)
    assert "step 2 " in message and f"0..{classes - 1}" in message and "Fix" in message
    changed = [not np.array_equal(a, b.numpy()) for a, b in zip(weights, model.trainable_weights, strict=True)]
    assert any(changed)  # the two good steps ran


@pytest.mark.intel
def test_a_model_built_before_auto_configure_is_warned_about(zoo_models, caplog):
    plan = amp_backends.plan_for()
    if plan.policy == "float32":
        pytest.skip("this machine's plan is float32: a model built before it computes as the plan says")
    model = zoo_models.fresh("two_heads", "float32")  # built first ...
    plan = here()  # ... then the plan
    x, y = data("two_heads", STEP_BATCH)
    trainer = amp_backends.Trainer(updates_for("two_heads", model), plan, batch_size=STEP_BATCH, progress=False)
    caplog.set_level(logging.INFO, logger="amp_backends.train")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AmpWarning)
        trainer.fit(x, y, max_steps=1)
    said = [str(w.message) for w in caught
            if issubclass(w.category, AmpWarning) and "auto_configure()" in str(w.message)]
    assert len(said) == 1 and "computes in float32" in said[0] and "build it after auto_configure()" in said[0], said
    # the precision check finds it too, in its report (said once: as information)
    assert any("before building the model" in r.message and r.levelno == logging.INFO for r in caplog.records)


@pytest.mark.intel
def test_token_ids_past_the_vocabulary_are_the_datas_fault_with_the_fix(zoo_models):
    plan = here()
    if plan.backend != "cpu":
        pytest.skip("a GPU's gather gives zeros for an id past its table, with no error to translate")
    model = zoo_models.fresh("lstm", plan.policy)  # Embedding(5000, 64)
    x, y = data("lstm", 3 * STEP_BATCH, seed=5)
    x = x.copy()
    x[2 * STEP_BATCH, 7] = 5000  # a tokenizer with a larger vocabulary than the model's
    trainer = amp_backends.Trainer(updates_for("lstm", model), plan, batch_size=STEP_BATCH, progress=False,
                                   check_models=False)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(STEP_BATCH)
    with pytest.raises(InputError) as err:  # not TensorFlow's InvalidArgumentError from inside the graph
        trainer.fit(ds, max_steps=3)
    message = str(err.value)
    assert "5000" in message and "0..4999" in message and "embedding" in message and "input_dim >= 5001" in message
    assert "step 2" in message


# ------------------------------------------------------------------------------------ what these models showed
@pytest.mark.intel
def test_a_float32_output_head_that_is_most_of_the_flops_is_not_a_model_built_before_the_plan():
    """A small LM's float32 logits head is most of its FLOPs: the check said 'built before the plan' (it was not)."""
    h100 = amp_backends.configure_for_device("h100")
    inputs = K.Input((16, 64))
    h = K.layers.Dense(64, name="inner")(inputs)
    model = K.Model(inputs, K.layers.Dense(4096, dtype="float32", name="logits")(h), name="head_heavy")
    result = amp_backends.check_model(model, plan=h100, batch_size=BATCH)
    assert "policy-mismatch" not in codes(result), result.render()
    (head,) = [f for f in result.findings if f.code == "float32-compute"]
    assert head.layer == "head_heavy/logits" and head.severity == "warning" and "dtype='float32'" in head.fix
    with policy("float32"):  # built before the plan: still said so, once
        before = K.Model(inputs, K.layers.Dense(4096, name="logits")(K.layers.Dense(64)(inputs)), name="before")
    assert codes(amp_backends.check_model(before, plan=h100, batch_size=BATCH))[0] == "policy-mismatch"


@pytest.mark.intel
def test_classifier_updates_take_one_class_id_per_position():
    """A tagger or language model: (N, T, classes) outputs, (N, T) labels — refused before as 'shape (N,)'."""
    plan = here()
    model = K.Sequential([K.Input((12,), dtype="int32"), K.layers.Embedding(50, 16),
                          K.layers.Dense(5, dtype="float32")], name="tagger")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 50, (8, 12)).astype("int32"), rng.integers(0, 5, (8, 12)).astype("int32")
    loss = K.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = amp_backends.Trainer(amp_backends.classifier_updates(model, K.optimizers.Adam(), loss), plan,
                                   batch_size=4, progress=False, check_models=False)
    assert finite(trainer.fit(x, y, max_steps=2).last_losses.values())
    y[3, 4] = 5  # still checked: every id in 0..4
    with pytest.raises(ValueError, match=r"0\.\.4"):
        amp_backends.Trainer(amp_backends.classifier_updates(model, K.optimizers.Adam(), loss), plan, batch_size=4,
                             progress=False, check_models=False).fit(x, y, max_steps=1)


def test_lookup_error_reads_tensorflows_message():
    from amp_backends.training.step import lookup_error

    message = ("indices[1,44] = 8192 is not in [0, 8192)\n\t [[{{node while/cond_1/gpt2_causal_lm_1/token_embedding_1/"
               "GatherV2}}]] [Op:__inference_run_47603]")
    error = lookup_error(message, 6, 2)
    assert isinstance(error, InputError) and "steps 6..7" in str(error) and "0..8191" in str(error)
    assert "token_embedding_1" in str(error) and "input_dim >= 8193" in str(error)
    assert lookup_error("Incompatible shapes: [4,10] vs. [4,11]", 0) is None
