"""Ready-made updates: a classifier (any Keras model and loss), the tutorials' GAN, and MNIST batches; and what
`Trainer.fit` is given, checked (Keras ``fit``'s keywords it does not take refused with what does their work)."""

from __future__ import annotations

import difflib
import logging
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from ..errors import AmpConfigError, InputError
from .checkpoints import CheckpointStore
from ..labels import check_label_shape, class_ids
from ..model_inputs import check_model_inputs, leaf_paths
from ..model_outputs import check_probabilities
from .inputs import is_count
from .metrics import masked_weights, record_predictions
from ..keras_compat import model_losses, not_an_optimizer, user_code
from .step import Evaluation, Update, float32_outputs, step_seed

logger = logging.getLogger("amp_backends.train")


def _per_example(loss: Any) -> tuple[Any, bool]:
    """``(fn, sparse)``: ``fn(y_true, y_pred)`` gives one loss per example (from a Keras loss, a name or a
    function); ``sparse``: it takes class ids."""
    if loss is None:
        loss = tf.keras.losses.SparseCategoricalCrossentropy()
    elif isinstance(loss, str):
        try:
            loss = tf.keras.losses.get(loss)
        except (ValueError, TypeError):  # (Keras's own words are about custom object scopes)
            near = difflib.get_close_matches(loss, [n for n in dir(tf.keras.losses) if n.islower() and n not in (
                "get", "serialize", "deserialize")], n=1)
            raise AmpConfigError(f"Unknown loss {loss!r}. Expected a Keras loss name, such as "
                                 "'sparse_categorical_crossentropy' or 'mse', a keras.losses object or a function "
                                 f"(y_true, y_pred) -> losses. Fix: {f'did you mean {near[0]!r}? ' if near else ''}"
                                 "check the spelling, or pass the loss object.") from None
    if isinstance(loss, tf.keras.losses.Loss):
        # .call: one value per example on Keras 2 and 3 alike (the object's own reduction does not apply)
        return loss.call, isinstance(loss, tf.keras.losses.SparseCategoricalCrossentropy)
    if callable(loss):
        return loss, getattr(loss, "__name__", "") == "sparse_categorical_crossentropy"
    several = (" For a model of several outputs, one function that adds the outputs' losses, e.g. lambda y, pred: "
               "ce(y['class'], pred['class']) + mse(y['value'], pred['value']), with Keras losses' .call (one value "
               "per example).") if isinstance(loss, (dict, list, tuple)) else ""
    raise AmpConfigError(f"loss must be a Keras loss (object or name) or a function (y_true, y_pred) -> losses. "
                         f"Received: {loss!r} (of type {type(loss).__name__}).{several}")


def _num_classes(model: Any) -> int | None:
    try:
        shape = model.outputs[0].shape if getattr(model, "outputs", None) else model.output_shape
        n = shape[-1]
        return int(n) if n is not None else None
    except Exception:  # a subclassed model that was not built yet
        return None


def _per_position(model: Any, y: Any) -> Any:
    """Labels of a model that classifies every position (a language model's (N, T, vocabulary) logits, a tagger): one
    class id per position, (N, T), checked as the flat list of ids they are; other labels as they are."""
    try:
        rank = len(model.outputs[0].shape) if getattr(model, "outputs", None) else len(model.output_shape)
    except Exception:  # a subclassed model that was not built yet
        return y
    y = np.asarray(y)
    return y.reshape(-1) if rank > 2 and y.ndim == rank - 1 else y


def classifier_updates(model: Any, optimizer: Any, loss: Any = None) -> list[Update]:
    """One update: the mean of ``loss(y, model(x, training=True))`` over the batch (weighted, if it has weights).

    Batches are ``(x, y)`` or ``(x, y, sample_weight)``; ``x`` may be a dict or tuple (several inputs). Sparse
    labels are checked before training: class ids within the model's outputs.

    Args:
        model: A built Keras model.
        optimizer: Its optimizer.
        loss: A Keras loss object or name (default: sparse categorical cross-entropy), or ``loss(y, pred)``.

    Returns:
        The one `Update` for `Trainer`.

    Raises:
        AmpConfigError: The model is no Keras model or not built, the optimizer is no optimizer, or one Keras loss is
            given for a model with several outputs.
    """
    _check_parts([model], [optimizer])
    per_example, sparse, forward = *_per_example(loss), user_code(model)
    outputs = getattr(model, "outputs", None) or []
    keras_loss = loss is None or isinstance(loss, (str, tf.keras.losses.Loss)) or getattr(
        loss, "__module__", "").partition(".")[0] in ("keras", "tf_keras")  # (a function of keras.losses too)
    if len(outputs) > 1 and keras_loss:
        one = getattr(loss, "__name__", None) or loss or "the default sparse categorical cross-entropy"
        raise AmpConfigError(
            f"The model {model.name!r} has {len(outputs)} outputs, and one Keras loss ({one}) takes one. Fix: give "
            "loss= a function (y, pred) -> one loss per example that combines the outputs' losses (y and pred are "
            "the model's structure: dicts for named outputs), or write an amp_backends.Update of your own.")

    @tf.autograph.experimental.do_not_convert  # (ours; the user's loss is converted: user_code)
    def losses(y, pred):
        pred = float32_outputs(pred)  # (float16 logs and sums lose digits)
        if not isinstance(loss, tf.keras.losses.Loss) and not sparse:  # a function: ranks as a Loss object matches
            y = y if isinstance(y, (dict, tuple, list)) else _same_rank(y, pred)
        return tf.cast(user_code(per_example)(y, pred), tf.float32)

    @tf.autograph.experimental.do_not_convert
    def loss_fn(batch):
        _check_labelled(batch)
        x = check_model_inputs(model, batch[0])  # while tracing: before any step runs; each batch's shapes as it runs
        raw = forward(x, training=True)
        pred = float32_outputs(raw)
        values = losses(batch[1], pred)
        record_predictions("model", batch[1], pred, batch[2] if len(batch) == 3 else None)
        w = masked_weights(values, batch[2] if len(batch) == 3 else None, raw)
        mean = tf.reduce_mean(values) if w is None else tf.reduce_sum(values * w) / tf.maximum(tf.reduce_sum(w), 1e-12)
        return model_losses(model, added_to=mean)  # its regularizers' and add_loss terms too, as fit adds them

    def check(x):  # NumPy numbers (strings are the model's StringLookup's to check): before anything is traced
        if all(getattr(getattr(a, "dtype", None), "kind", "") in ("f", "i", "u", "b") for a in tf.nest.flatten(x)):
            check_model_inputs(model, x)

    def validate(sample):
        _check_labelled(sample)
        check(sample[0])  # validation arrays too, before training (training's: as it traces)
        _warn_of_nonfinite_inputs(sample[0])
        if len(sample) == 3:
            w = np.asarray(sample[2], dtype=np.float64)
            y_shape = np.shape(sample[1]) if sparse and not isinstance(sample[1], (dict, tuple, list)) else ()
            if w.ndim != 1 and w.shape[1:] != (1,) and (len(y_shape) < 2 or w.shape != y_shape):
                per_value = f", or one per label value, shape {y_shape}" if len(y_shape) > 1 else ""
                raise InputError(f"sample_weight has shape {w.shape}. Expected one weight per sample, shape (N,)"
                                 f"{per_value}. Fix: give one weight per sample (for a weight per class, map the "
                                 "labels to weights: w = class_weights[y]).")
            if not np.isfinite(w).all() or (w < 0).any():
                raise InputError("sample_weight must be finite and not negative (a weight per sample; 0 leaves a "
                                 f"sample out). Received values from {w.min()} to {w.max()}. Fix: clean the weights, "
                                 "e.g. np.clip(w, 0, None) where negative weights are a mistake.")
        if _loss_name(loss) == "categoricalcrossentropy" and np.ndim(sample[1]) == 1 and (classes or 0) > 1:
            raise InputError(f"The labels y are class ids (shape {np.shape(sample[1])}), but categorical cross-entropy "
                             f"takes one-hot rows (shape (N, {classes})). Fix: loss='sparse_categorical_crossentropy' "
                             f"for class ids, or one-hot labels: keras.utils.to_categorical(y, {classes}).")
        if len(outputs) == 1:  # (sparse labels: as class ids, below; an output of unknown rank: not compared)
            shape = outputs[0].shape  # (Keras 3: a tuple; Keras 2: a TensorShape, of unknown rank perhaps)
            check_label_shape(sample[1], None if getattr(shape, "rank", 0) is None else tuple(shape[1:]),
                              "" if sparse else _loss_name(loss), model.name, error=InputError)
        if sparse and not isinstance(sample[1], (dict, tuple, list)):  # (several outputs: the loss's own checks)
            owner = (f" (the model has {classes} outputs)" if classes > 1 else " (the model has 1 output: one "
                     "class; for two classes on one sigmoid unit, pass loss='binary_crossentropy')") if classes else ""
            class_ids(_per_position(model, sample[1]), classes, "The labels y", owner=owner, error=InputError)
        if len(outputs) == 1 and _takes_probabilities(loss):
            check_probabilities(model, sample[0], _loss_name(loss or "sparse_categorical_crossentropy"))
        if binary and not isinstance(sample[1], (dict, tuple, list)):
            if not np.isfinite(y := np.asarray(sample[1], np.float64)).all() or (y < 0).any() or (y > 1).any():
                raise InputError(f"Binary cross-entropy takes labels from 0 to 1 (the probability of the class). "
                                 f"Received labels from {np.nanmin(y)} to {np.nanmax(y)}. Fix: map them to 0 and 1, "
                                 "or for several classes loss='sparse_categorical_crossentropy' and one output unit "
                                 "per class.")

    # a binary cross-entropy (by name, function or class): metrics=["accuracy"] is then binary
    classes, binary_loss = _num_classes(model), "binary" in _loss_name(loss)
    binary = binary_loss and not sparse
    span = f"0..{classes - 1}" if classes else "0 and up"
    ids = (f"labels that are not class ids in {span} (NaN, a fraction, a negative id or one past the model's "
           f"{classes or '?'} outputs), or " if sparse else "labels outside 0..1 or not finite, or " if binary else "")
    expected = f"class ids in {span} and " if sparse else "labels from 0 to 1 and " if binary else ""
    message = (f"holds {ids}sample weights that are negative or not finite. Expected {expected}"
               "finite weights of 0 or more in every batch (the check before training sees the first batch of a "
               "dataset). Fix: clean the pipeline (dataset.map, or dataset.filter to drop such rows)"
               + (", or give the model's last layer as many units as there are classes." if sparse else "."))
    evaluation = Evaluation(predict=lambda x: forward(check_model_inputs(model, x), training=False), loss=losses,
                            binary=binary_loss, outputs=max(1, len(outputs)), check=check,
                            own=lambda: model_losses(model))
    return [Update("model", loss_fn, [(model.trainable_variables, optimizer)], validate=validate,
                   state=model.non_trainable_variables, check=_batch_check(classes, sparse, binary),
                   check_message=message, evaluation=evaluation)]


def _loss_name(loss: Any) -> str:
    """A loss's name, lower case, without underscores, from a name, a function or a class."""
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", "") or type(loss).__name__
    return str(name).lower().replace("_", "")


def _takes_probabilities(loss: Any) -> bool:
    """Whether ``loss`` is a cross-entropy of probabilities (``from_logits=False``; the default loss too)."""
    loss = tf.keras.losses.get(loss) if isinstance(loss, str) else loss
    return loss is None or (_loss_name(loss) in ("sparsecategoricalcrossentropy", "categoricalcrossentropy",
                                                 "binarycrossentropy")
                            and not getattr(loss, "_fn_kwargs", {}).get("from_logits", False))


def _same_rank(y: Any, pred: Any) -> Any:
    """Labels of one rank more or less than a single-output prediction, brought to its rank, as Keras's Loss
    objects do before calling their function ((N,) labels for a sigmoid's (N, 1), say)."""
    if not hasattr(y, "shape") or not hasattr(pred, "shape") or pred.shape.rank is None or pred.shape[-1] != 1:
        return y
    y = tf.convert_to_tensor(y)
    if y.shape.rank == pred.shape.rank - 1:
        return tf.expand_dims(y, -1)
    if y.shape.rank == pred.shape.rank + 1 and y.shape[-1] == 1:
        return tf.squeeze(y, -1)
    return y


def _batch_check(classes: int | None, sparse: bool, binary: bool = False) -> Any:
    """The compiled check of every batch (`Update`'s ``check``): class ids whole, finite and in range (``sparse``),
    binary labels finite and from 0 to 1 (``binary``), sample weights finite and not negative."""

    def valid(t: Any, kind: str) -> Any:
        good = t >= tf.zeros([], t.dtype)
        if kind == "ids" and classes:
            good = tf.logical_and(good, t < tf.cast(classes, t.dtype))
        if kind == "binary":
            good = tf.logical_and(good, t <= tf.ones([], t.dtype))
        if t.dtype.is_floating:
            whole = tf.equal(t, tf.round(t)) if kind == "ids" else tf.ones_like(good)
            good = tf.logical_and(good, tf.logical_and(tf.math.is_finite(t), whole))
        return good

    @tf.autograph.experimental.do_not_convert
    def check(batch):
        if isinstance(batch, dict) or not isinstance(batch, (tuple, list)) or len(batch) < 2 or batch[1] is None \
                or isinstance(batch[1], (dict, tuple, list)):
            return tf.constant(True), batch  # (unlabelled or several outputs: the loss_fn says what it needs)
        parts, ok = list(batch), tf.constant(True)
        labels = "ids" if sparse else "binary" if binary else ""
        for i, kind in ((1, labels), (2, "weights")):  # the labels (class ids, binary), the sample weights
            if i >= len(parts) or parts[i] is None or not kind:
                continue
            t = tf.convert_to_tensor(parts[i])
            if t.dtype.is_floating or t.dtype.is_integer:
                good = valid(t, kind)
                ok = tf.logical_and(ok, tf.reduce_all(good))
                parts[i] = tf.where(good, t, tf.zeros_like(t))  # what a step that is then skipped computes on
        return ok, tuple(parts)

    return check


def _check_parts(models: Sequence[Any], optimizers: Sequence[Any]) -> None:
    """Built Keras models and optimizer objects, else `AmpConfigError` with the fix."""
    for model in models:
        if not callable(model) or not hasattr(type(model), "variables"):  # (the class: Keras 2 raises unbuilt)
            raise AmpConfigError(f"expected a Keras model (keras.Model). Received: {model!r:.80} (of type "
                                 f"{type(model).__name__}). Fix: pass the model the update trains.")
        if not (built := getattr(model, "built", True)) or not model.variables:
            raise AmpConfigError(
                f"The model {getattr(model, 'name', model)!r} {'is marked built, but' if built else 'is not built:'}"
                " it has no variables to train. Fix: start it with keras.Input(shape), or call it once on a batch "
                "(model(x[:1])): that builds a subclassed model's layers, as model.build(input_shape) does not.")
    for got in filter(None, map(not_an_optimizer, optimizers)):
        raise AmpConfigError(f"expected a Keras optimizer, such as keras.optimizers.Adam(1e-3). Received: {got}. "
                             "Fix: pass an optimizer object (not its name or class).")


def _warn_of_nonfinite_inputs(x: Any) -> None:
    """A warning for NaN or Inf in floating inputs: a batch holding one has a NaN loss (unless the model replaces
    them itself), and its step is skipped as if its gradients had overflowed."""
    for name, leaf in leaf_paths(x, "x"):
        a = np.asarray(leaf)
        if a.dtype.kind != "f" or a.size == 0:
            continue
        rows = a.reshape(len(a), -1) if a.ndim else a.reshape(1, 1)
        step = max(1, 2**22 // max(rows.shape[1], 1))  # (in pieces: no temporary the size of the data)
        bad = [np.flatnonzero(~np.isfinite(rows[i:i + step]).all(axis=1)) + i for i in range(0, len(rows), step)]
        if not (bad_rows := np.concatenate(bad)).size:
            continue
        count = sum(int((~np.isfinite(rows[bad_rows[j:j + step]])).sum()) for j in range(0, len(bad_rows), step))
        logger.warning(f"The inputs {name} hold {count} NaN or Inf value(s), the first in sample "
                       f"{int(bad_rows[0])}: a batch with one has a NaN loss, unless the model replaces "
                       "them itself, and its step is skipped (the log says non-finite gradients). Fix: clean them "
                       "(np.nan_to_num, an imputed value) or drop those samples before training.")


def _check_labelled(batch: Any) -> None:
    if isinstance(batch, dict):
        raise InputError(f"classifier_updates takes batches (x, y) or (x, y, sample_weight); the data yields dicts "
                         f"(keys {sorted(batch)}). Fix: map them to a tuple, e.g. dataset.map(lambda d: (d['image'], "
                         "d['label'])) with your keys.")
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3) or batch[1] is None:
        pair = isinstance(batch, (tuple, list))
        what = ("no labels: y is None (arrays given as fit(x) alone; a tuple given as x is the model's inputs)"
                if pair and len(batch) in (2, 3) else f"a {type(batch).__name__} of {len(batch)} item"
                + ("s" if len(batch) != 1 else "") if pair
                else f"one {type(batch).__name__} per batch, no labels (a dataset of the inputs alone)")
        raise InputError("classifier_updates trains on labelled batches: (x, y) or (x, y, sample_weight). Received "
                         f"{what}. Fix: fit(x, y), or a dataset of (x, y) or (x, y, sample_weight) batches.")


def gan_updates(generator: Any, discriminator: Any, g_opt: Any, d_opt: Any) -> list[Update]:
    """The tutorials' GAN: a generator update, then a discriminator update, each with its own forward pass.

    The batches are real images (a tensor, or the first item of a tuple). The noise is uniform in [-1, 1], drawn
    per step from the trainer's seed (`step_seed`).

    Args:
        generator: The built generator (noise to images).
        discriminator: The built discriminator (images to one logit).
        g_opt: The generator's optimizer.
        d_opt: The discriminator's optimizer.

    Returns:
        The generator's and the discriminator's `Update`, in that order.

    Raises:
        AmpConfigError: A model is no Keras model or not built, or an optimizer is no optimizer.
    """
    from ..models import NOISE_DIM, gan_losses

    _check_parts([generator, discriminator], [g_opt, d_opt])

    @tf.autograph.experimental.do_not_convert
    def forward(batch, salt):
        real = batch[0] if isinstance(batch, (tuple, list)) else batch
        n = real.shape[0]
        if n is None:
            raise InputError("gan_updates needs batches of a fixed size (its labels are built per batch). Fix: batch "
                             "the dataset with drop_remainder=True.")
        noise = tf.random.stateless_uniform([n, NOISE_DIM], seed=step_seed(salt), minval=-1.0, maxval=1.0)
        return gan_losses(user_code(generator), user_code(discriminator), real, noise)

    def loss(salt: int, which: int) -> Any:  # (the model's own losses added, as fit adds them)
        model = (generator, discriminator)[which]
        return tf.autograph.experimental.do_not_convert(lambda b: model_losses(model, forward(b, salt)[which]))

    state = generator.non_trainable_variables + discriminator.non_trainable_variables  # BatchNorm statistics
    return [
        Update("generator", loss(1, 0), [(generator.trainable_variables, g_opt)], state=state),
        Update("discriminator", loss(2, 1), [(discriminator.trainable_variables, d_opt)], state=state),
    ]


@tf.autograph.experimental.do_not_convert
def mnist_batch_fn(x: Any, y: Any, idx: Any) -> Any:
    """Gather a batch of uint8 MNIST images on the device and scale to [0, 1] (as the tutorials: /255).

    Args:
        x: The images, uint8, 28x28 each (resident on the device).
        y: Their labels, or ``None``.
        idx: The batch's sample indices.

    Returns:
        ``(images, labels)``: float32 images shaped ``(batch, 28, 28, 1)``, and the labels (``None`` without).
    """
    xb = tf.reshape(tf.cast(tf.gather(x, idx), tf.float32) / 255.0, [-1, 28, 28, 1])
    return xb, (None if y is None else tf.gather(y, idx))


FIT_KEYWORDS = ("x", "y", "epochs", "max_steps", "resume", "steps_per_epoch", "validation_data", "validation_every")
# Keras fit's keywords that Trainer.fit does not take, and what does their work here
KERAS_FIT = {
    "batch_size": "give it to the Trainer: Trainer(updates, plan, batch_size=N) (every fit trains with it)",
    "verbose": "Trainer(..., progress=False) for no progress bar, log_every=N for a log line every N steps",
    "callbacks": "Trainer(..., observers=[...]): amp_backends.Observer objects, called around every compiled call "
                 "(EarlyStopping and ModelCheckpoint are the Trainer's patience= and keep_best=)",
    "class_weight": "weigh each sample by its class: a tf.data dataset of (x, y, weights[y]) batches",
    "sample_weight": "a tf.data dataset of (x, y, sample_weight) batches",
    "validation_split": "validation_data=(x_val, y_val), the samples you hold out",
    "validation_steps": "validation_data holding the batches to evaluate (dataset.take(N))",
    "validation_batch_size": "leave it out: validation takes the Trainer's batch_size",
    "validation_freq": "validation_every=N (epochs) or validation_every='500 steps'",
    "initial_epoch": "resume=True continues a run from its checkpoint (epochs count over the whole run)",
    "shuffle": "leave it out: arrays are shuffled each epoch from the Trainer's seed, a dataset is taken as it comes",
}


def _short(value: Any) -> str:
    """``value`` as an error quotes it: its repr where short, else its type (an array's shape, a list's items')."""
    if len(text := repr(value)) <= 60 and " object at 0x" not in text:
        return text
    if isinstance(getattr(value, "shape", None), (tuple, list)) or hasattr(getattr(value, "shape", None), "rank"):
        return f"<{type(value).__name__} of shape {tuple(value.shape)}>"
    if isinstance(value, (list, tuple)) and len(value) <= 4:
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return f"<{type(value).__name__}>"


def _keyword_fix(name: str, candidates: Sequence[str]) -> str:
    """The fix for a keyword ``name`` that is not taken: what does Keras fit's ``name``'s work here, else the nearest
    of ``candidates`` (with what does its work, where it is Keras fit's), else to leave it out."""
    if name in KERAS_FIT:
        return KERAS_FIT[name] + "."
    near = difflib.get_close_matches(name, candidates, n=1)
    if not near:
        return "leave it out."
    return f"did you mean {near[0]}=?" + (f" ({KERAS_FIT[near[0]]})." if near[0] in KERAS_FIT else "")


def check_trainer_keywords(keywords: Mapping[str, Any], own: Sequence[str]) -> None:
    """No keyword beyond the `Trainer`'s ``own``: one of ``fit``'s, or of Keras ``fit``'s, is refused saying where it
    goes, another with the nearest name."""
    for name, value in keywords.items():
        fix = (f"give it to fit(): trainer.fit(x, y, {name}=...)." if name in FIT_KEYWORDS
               else _keyword_fix(name, [*own, *FIT_KEYWORDS[2:], *KERAS_FIT]))
        raise AmpConfigError(f"Trainer() takes no {name}=. Received: {name}={_short(value)}. Expected the Trainer's "
                             "own keywords (batch_size, checkpoint_dir, metrics, patience...; fit() takes epochs and "
                             f"the data). Fix: {fix}")


def check_fit_arguments(keras_fit: Mapping[str, Any], *, epochs: Any, max_steps: Any, resume: bool,
                        store: CheckpointStore | None) -> None:
    """`Trainer.fit`'s own arguments (positive counts, ``resume`` only with a checkpoint directory), and no other
    keyword: one of Keras ``fit``'s is refused with what does its work here, another with the nearest name."""
    for name, value in keras_fit.items():
        whose = "Keras fit takes it" if name in KERAS_FIT else "a name it does not know"
        raise AmpConfigError(f"Trainer.fit() takes no {name}= ({whose}). Received: {name}={_short(value)}. Expected "
                             f"keywords: {', '.join(FIT_KEYWORDS[2:])}. Fix: "
                             f"{_keyword_fix(name, FIT_KEYWORDS + tuple(KERAS_FIT))}")
    for name, value in (("epochs", epochs), ("max_steps", max_steps)):
        if (value is not None or name == "epochs") and not is_count(value):
            raise AmpConfigError(f"{name} must be a positive integer{' or None' if name == 'max_steps' else ''}. "
                                 f"Received: {name}={value!r}. Fix: pass {name}=1 or more (an int): it counts "
                                 "over the whole run.")
    if resume and store is None:
        raise AmpConfigError("fit(resume=True) continues from checkpoints, but this Trainer has no checkpoint_dir. "
                             "Fix: build the Trainer with checkpoint_dir=..., or leave resume out.")
