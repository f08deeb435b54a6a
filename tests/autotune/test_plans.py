"""The plan tuner (`amp_backends.autotune.tune`) on this machine: candidates timed on a real model, the fastest
applied, cached, reported."""

from __future__ import annotations

import json
import logging
import signal
import warnings

import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends import autotune, keras_compat  # noqa: E402
from amp_backends.data import synthetic_mnist  # noqa: E402
from amp_backends.models import mnist_cnn  # noqa: E402
from amp_backends.training import classifier_updates, mnist_batch_fn  # noqa: E402


def build():
    # small, so that compiling each candidate (XLA on the CPU included) stays cheap
    k = tf.keras
    m = k.Sequential([k.Input((28, 28, 1)), k.layers.Flatten(), k.layers.Dense(32, activation="relu"),
                      k.layers.Dense(10, activation="softmax", dtype="float32")])
    opt = tf.keras.optimizers.Adam(1e-3)
    return [m], classifier_updates(m, opt), {"m": m}


def test_tune_times_candidates_applies_the_fastest_and_caches_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    caplog.set_level(logging.INFO, logger="amp_backends.autotune")
    (x, y), _ = synthetic_mnist(128, 8)
    plan = autotune.tune(build, x, y, batch_size=16, steps=2, batch_fn=mnist_batch_fn)
    cache = json.loads((tmp_path / "tune.json").read_text())
    assert len(cache) == 1
    (key, entry), = cache.items()
    tried = {(t["policy"], t["xla"]) for t in entry["trials"]}
    from amp_backends.backends.cpu import probe_cpu

    if plan.backend == "cpu":  # every native policy, with XLA on and off (XLA runs on CPUs, slowly)
        natives = {"float32", "mixed_bfloat16"} if probe_cpu().native_bf16 else {"float32"}
        assert tried == {(p, x) for p in natives for x in (True, False)}
    else:
        from amp_backends.configure import plan_for

        assert tried == {(c["policy"], c["xla"]) for c in autotune.candidates(plan_for(environ={}))}
    best = max((t for t in entry["trials"] if t["img_per_s"]), key=lambda t: t["img_per_s"])
    assert (plan.policy, plan.xla) == (entry["policy"], entry["xla"])
    assert set(entry["timings"]) == {f"policy={p} xla={x}" for p, x in tried}  # every round of every candidate
    if entry["within_noise"]:  # no candidate won every interleaved round: the rules' plan stays
        from amp_backends.configure import plan_for

        rules = plan_for(environ={})
        assert (plan.policy, plan.xla) == (rules.policy, rules.xla)
    else:
        assert (plan.policy, plan.xla) == (best["policy"], best["xla"])
    assert keras_compat.global_policy_name(tf) == plan.policy
    # the second call applies the cached choice without timing, with the other overrides kept
    caplog.clear()
    again = autotune.tune(build, x, y, batch_size=16, steps=2, batch_fn=mnist_batch_fn,
                          overrides={"loss_scale": "fixed:8", "policy": "float16"})
    assert (again.policy, again.xla) == (plan.policy, plan.xla) and str(again.loss_scale) == "fixed:8"
    assert any("cached choice" in r.message for r in caplog.records)
    # and the report lists it for this device
    from amp_backends.commands.capability_report import collect

    d = collect(use_tensorflow=True, environ={}).data
    assert key in d["autotune"]["choices"] and d["autotune"]["cache"] == str(tmp_path / "tune.json")


def test_model_signature_distinguishes_models_and_batches():
    a, b = mnist_cnn(), tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    assert autotune.model_signature([a], 16) != autotune.model_signature([b], 16)
    assert autotune.model_signature([a], 16) != autotune.model_signature([a], 32)
    assert autotune.model_signature([a], 16) == autotune.model_signature([mnist_cnn()], 16)


def test_a_cache_that_cannot_be_written_is_said_and_not_claimed(tmp_path, monkeypatch, caplog):
    """tune logged "cached in PATH" after the store had warned it could not write there."""
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(tmp_path / "afile" / "tune.json"))
    assert autotune.store("key", {"policy": "float32"}) is False
    assert "Could not write the cache" in caplog.text
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    assert autotune.store("key", {"policy": "float32"}) is True


def test_tune_says_an_unwritable_cache_before_the_timing_and_each_step_as_it_goes(tmp_path, monkeypatch, caplog):
    """A cache under a file was said only after minutes of timing, which printed nothing until it ended."""
    from amp_backends.autotune import plans

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(tmp_path / "afile" / "tune.json"))
    monkeypatch.setattr(plans, "candidates", lambda base: [{"policy": "float32", "xla": False}])  # (one: quick)
    caplog.set_level(logging.INFO, logger="amp_backends")
    (x, y), _ = synthetic_mnist(64, 8)
    autotune.tune(build, x, y, batch_size=16, steps=2, batch_fn=mnist_batch_fn)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autotune")]
    first = [next(i for i, m in enumerate(said) if text in m) for text in (
        f"the cache {tmp_path / 'afile' / 'tune.json'} cannot be written ({tmp_path / 'afile'} is a file, not a folder)"
        ": the choice will be timed but not kept", "timing 1 candidate plan on this model",
        "policy=float32 xla=False: built and warmed up (1 of 1)", "img/s (min-max")]
    assert first == sorted(first), said
    from amp_backends.cache import unwritable

    assert unwritable(tmp_path) == f"{tmp_path} is a folder" and unwritable(tmp_path / "new" / "t.json") is None


def test_a_damaged_cache_or_a_model_that_never_builds_neither_stops_tune_nor_info(tmp_path, monkeypatch, caplog):
    """A hand-edited entry for this device (no rate) raised KeyError in tune and made `amp-backends info` exit 1
    with a traceback; an unreadable cache was replaced without a word; a build that raised under the rules' plan
    came out of tune, where a candidate that fails is documented to lose."""
    from amp_backends.commands.capability_report import collect, render_text
    from amp_backends.terminal import as_text
    from amp_backends.configure import reset

    cache = tmp_path / "tune.json"
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(cache))
    signature = collect(use_tensorflow=True, environ={}).data["autotune"]["device"]
    cache.write_text(json.dumps({f"{signature}#model": {"policy": "float32", "xla": False}}))
    report = collect(use_tensorflow=True, environ={})
    assert report.data["autotune"]["choices"] == {} and not autotune.valid_entry({"policy": "fp16", "xla": 1})
    assert "Plan" in as_text(lambda console: render_text(report, console), 100)  # (it raised KeyError)
    cache.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="amp_backends"):
        assert autotune.load_cache() == {}
    assert f"The cache {cache} cannot be read as its JSON object" in caplog.text

    def never_builds():
        raise RuntimeError("this model needs a GPU")

    (x, y), _ = synthetic_mnist(32, 8)
    caplog.clear()
    try:
        with caplog.at_level(logging.INFO, logger="amp_backends"):
            plan = autotune.tune(never_builds, x, y, batch_size=16, steps=2, batch_fn=mnist_batch_fn)
    finally:
        reset()
    assert plan is not None and "every candidate failed; keeping the rule-based plan" in caplog.text
    assert "did not build under the rules' plan (RuntimeError: this model needs a GPU)" in caplog.text


@pytest.mark.parametrize("fails_at", [1, 3], ids=["in its warm-up", "in the timed rounds"])
def test_a_candidate_that_fails_loses_alone_and_the_others_are_still_timed(tmp_path, monkeypatch, caplog, fails_at):
    """A candidate that raised in its warm-up stayed among the timed ones (and one raising in a timed round ended
    the timing): every candidate was lost, "every candidate failed; keeping the rule-based plan"."""
    from amp_backends.autotune import plans

    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    monkeypatch.setattr(plans, "candidates", lambda plan: [{"policy": "float32", "xla": True},
                                                            {"policy": "float32", "xla": False}])
    real = plans._continue

    def breaks_under_xla(trainer, x, y, steps):
        call, calls = real(trainer, x, y, steps), iter(range(1, 10**6))
        if not trainer.plan.xla:
            return call

        def once_more():
            if next(calls) >= fails_at:  # (warm-up: calls 1 and 2)
                raise RuntimeError("XLA could not compile this model")
            return call()
        return once_more

    monkeypatch.setattr(plans, "_continue", breaks_under_xla)
    caplog.set_level(logging.INFO, logger="amp_backends")
    (x, y), _ = synthetic_mnist(128, 8)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        plan = autotune.tune(build, x, y, batch_size=16, steps=2, batch_fn=mnist_batch_fn)
    assert (plan.policy, plan.xla) == ("float32", False)
    # nor are a candidate's caveats the user's ("xla=on (from argument) honoured, but expect little ...")
    assert not [w for w in said if "(from argument)" in str(w.message)], [str(w.message) for w in said]
    assert "every candidate failed" not in caplog.text
    # the candidates' trainers said their "Training on ..." and "Summary: 2 steps" lines as if they were the run
    assert "Training on" not in caplog.text and "Summary:" not in caplog.text
    assert logging.getLogger("amp_backends.train").level in (logging.NOTSET, logging.INFO)
    assert "policy=float32 xla=True: failed (RuntimeError: XLA could not compile this model)" in caplog.text
    (entry,) = json.loads((tmp_path / "tune.json").read_text()).values()
    trials = {(t["policy"], t["xla"]): t for t in entry["trials"]}
    assert trials[("float32", True)]["img_per_s"] is None and "XLA could not compile" in trials[("float32", True)][
        "error"]
    assert trials[("float32", False)]["img_per_s"] > 0 and list(entry["timings"]) == ["policy=float32 xla=False"]


@pytest.mark.parametrize("stops_at", [1, 3], ids=["in a warm-up", "in the timed rounds"])
def test_ctrl_c_while_the_candidates_are_timed_is_said_as_the_tuning_and_caches_nothing(tmp_path, monkeypatch, caplog,
                                                                                       stops_at):
    """Ctrl-C inside a candidate's trainer was said as the user's training: "Interrupted (SIGINT) at step 10:
    checkpointing is off, nothing was saved", a step of a run that never started."""
    from amp_backends.autotune import plans
    from amp_backends.configure import current_plan
    from amp_backends.errors import TrainingInterrupted
    from amp_backends.training import resume

    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    monkeypatch.setattr(plans, "candidates", lambda plan: [{"policy": "float32", "xla": False}])
    monkeypatch.setattr(resume.StopSignals, "asked", False)  # (set by the Ctrl-C below; put back after the test)
    calls = iter(range(1, 10**6))
    real_enter = resume.StopSignals.__enter__

    def ctrl_c_in_a_call(self):  # the trainer's own handler gets SIGINT as the call starts, as from a terminal
        entered = real_enter(self)
        if next(calls) == stops_at:
            self._handle(signal.SIGINT, None)
        return entered

    monkeypatch.setattr(resume.StopSignals, "__enter__", ctrl_c_in_a_call)
    caplog.set_level(logging.INFO, logger="amp_backends")
    (x, y), _ = synthetic_mnist(64, 8)
    with pytest.raises(TrainingInterrupted) as stopped:
        autotune.tune(build, x, y, batch_size=16, steps=2, batch_fn=mnist_batch_fn)
    assert stopped.value.exit_code == 130 and stopped.value.message.startswith(
        "Interrupted (SIGINT) while autotune timed the candidate plans: nothing was trained, saved or cached. Fix:")
    assert "at step" not in caplog.text and "received: stopping" not in caplog.text, caplog.text
    assert not (tmp_path / "tune.json").exists() and current_plan() is None


def test_the_plan_chosen_does_not_say_its_xla_as_the_users_request(tmp_path, monkeypatch):
    """XLA chosen on a CPU warned "xla=on (from argument) honoured, but expect little or no speed-up": autotune's
    measured choice, said as if the user had asked for it. The user's own overrides keep their caveats."""
    from amp_backends.autotune import plans

    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    monkeypatch.setattr(plans, "candidates", lambda plan: [{"policy": "float32", "xla": True}])
    (x, y), _ = synthetic_mnist(64, 8)
    for _ in ("timed", "cached"):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            plan = autotune.tune(build, x, y, batch_size=16, steps=2, batch_fn=mnist_batch_fn,
                                 overrides={"loss_scale": "fixed:8"})
        assert plan.xla is True and plan.loss_scale.mode == "fixed"
        messages = [str(w.message) for w in said]
        assert not [m for m in messages if m.startswith(("xla=", "policy="))], messages
        assert [m for m in messages if m.startswith("loss_scale=fixed with float32: not needed")], messages
        # the plan says whose choice each is (its policy and XLA said "requested (argument)")
        assert plan.reasons["policy"].startswith("requested (autotune)") and "(autotune)" in plan.reasons["xla"]
        assert "(argument)" in plan.reasons["loss_scale"], plan.reasons
