"""Exercises: a check says right or wrong and why, judged against the best choice the simulator finds."""

import pytest

from zero_sim import simulate
from zero_sim.ui.exercise_checks import (
    BUCKET_SIZES_MB,
    FIT_RECOMPUTE,
    FIT_SCENARIO,
    check_bucket,
    check_fit,
    check_slowdown,
    fastest_fits,
    simulated_slowdown,
)
from zero_sim.ui.panels.exercises import bucket_exercise, fit_exercise, slowdown_exercise


def test_ddp_cannot_fit_a_7_5b_model_on_40gb_gpus_and_the_check_says_by_how_much():
    verdict = check_fit("ddp", "none", 1)
    assert not verdict.right
    assert "does not fit" in verdict.why and "42.3 GB" in verdict.why


def test_the_fastest_choice_that_fits_is_right_and_is_what_the_answer_names():
    (strategy, recompute, micro_batch), speed = fastest_fits()[0]
    verdict = check_fit(strategy, recompute, micro_batch)
    assert verdict.right
    assert f"1. {strategy}, recompute {recompute}, micro-batch {micro_batch}" in verdict.answer
    # It really fits, and it is what the simulator says it is.
    m = simulate(**FIT_SCENARIO, strategy=strategy, recompute=recompute, micro_batch=micro_batch).metrics
    assert m["memory"]["fits"] and m["tokens_per_s_per_gpu"] == pytest.approx(speed)


def test_a_choice_that_fits_but_recomputes_needlessly_is_told_how_much_slower_it_is():
    (strategy, recompute, _mb), _ = fastest_fits()[0]
    assert recompute != "full"
    verdict = check_fit(strategy, "full", 1)
    assert not verdict.right and "slower than the fastest choice that fits" in verdict.why


def test_the_best_bucket_is_right_and_the_extremes_are_not():
    per_size = {size: simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="pcie", micro_batch=8,
                               bucket_mb=size).metrics["exposed_comm_s"] for size in BUCKET_SIZES_MB}
    best = min(per_size, key=per_size.get)
    assert check_bucket(best).right
    worst = max(per_size, key=per_size.get)
    assert per_size[worst] > per_size[best] * 1.2
    assert not check_bucket(worst).right


def test_a_prediction_near_the_simulated_slowdown_is_right_and_a_wild_one_is_not():
    actual = simulated_slowdown()
    assert actual > 1.2  # the network matters to ZeRO-3 here, or the exercise teaches nothing
    assert check_slowdown(actual * 1.1).right
    assert not check_slowdown(1.0).right
    assert not check_slowdown(actual * 3).right
    assert "zero or negative" in check_slowdown(0).why


@pytest.mark.parametrize("guess", [1.0, 30.0])
def test_a_wrong_guess_gets_a_hint_about_what_limits_the_step_and_never_the_answer(guess):
    verdict = check_slowdown(guess)
    ratio = f"{simulated_slowdown():.2f}"
    assert ratio not in verdict.why and ratio in verdict.answer
    assert "compute" in verdict.why and ("Less" if guess > 3 else "More") in verdict.why


def test_a_right_guess_is_told_why_with_the_step_times_that_decide_it():
    actual = simulated_slowdown()
    verdict = check_slowdown(actual)
    assert verdict.right and verdict.why[0].isupper()
    assert f"({actual:.2f}x)" in verdict.why and "compute stays" in verdict.why
    # Every sentence starts with a capital letter.
    assert all(part[0].isupper() for part in verdict.why.split(". ")[1:])


def test_a_wrong_bucket_is_told_which_cost_it_pays_not_the_best_size():
    verdict = check_bucket(min(BUCKET_SIZES_MB))
    assert not verdict.right and "latency" in verdict.why and "MiB" not in verdict.why


def test_exercise_1_offers_only_the_recompute_modes_the_notebook_explains():
    offered = tuple(fit_exercise().controls["recompute"].options)
    assert offered == FIT_RECOMPUTE == ("none", "selective", "full")


def test_the_widgets_check_what_the_learner_set_and_show_the_answer_on_request():
    exercise = fit_exercise()
    exercise.controls["strategy"].value = "ddp"
    assert not exercise.check().right
    assert "Not yet." in exercise.feedback.value
    assert exercise.answer.value == ""
    (strategy, recompute, micro_batch), _ = fastest_fits()[0]
    exercise.controls["strategy"].value = strategy
    exercise.controls["recompute"].value = recompute
    exercise.controls["micro_batch"].value = micro_batch
    assert exercise.check().right and "Right." in exercise.feedback.value
    assert "fastest choices that fit" in exercise.reveal() and "Answer." in exercise.answer.value
    assert bucket_exercise().check().answer and slowdown_exercise().check().answer
