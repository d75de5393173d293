"""DAPO's dynamic sampling (Sec. 3.2) and overlong reward shaping (Sec. 3.4, eq. 13) in the RL step: all-equal groups
are dropped and refilled from further prompt batches with the batch size kept, padding after the cap carries no
loss, rows are joined across rounds with their images, and the options are refused where they cannot apply."""

import dataclasses
import types

import numpy as np
import pytest

from spatial_jax import config as C
from spatial_jax.rl.config import TrainConfig, validate
from spatial_jax.rl.dynamic_sampling import fill, informative_groups
from spatial_jax.rollout.collect import Collected
from spatial_jax.rollout.completions import Completions, take_rows

TINY = ["sft.steps=0", "rl.steps=1", "rl.sampling.max_new_tokens=12", "eval.after_rl=false",
        "data.train=synthetic:train:16", "data.eval=synthetic:heldout:4", "tensorboard=false", "progress=false",
        "data.bucket_lengths=[256,512]"]


def test_informative_groups():
    r = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [np.nan, 1, 0], [2, 2, 2.0000001], [-np.inf, -np.inf, -np.inf]])
    assert informative_groups(r).tolist() == [True, False, False, True, False]


def test_fill_drops_all_equal_groups_and_refills_to_the_batch_size():
    """Half the groups of each round are all-equal: they are dropped and the next rounds fill the batch."""
    rounds = [np.array([[1, 0], [3, 3], [0, 1], [2, 2]]),  # groups 0 and 2 carry a gradient
              np.array([[5, 5], [0, 2], [7, 7], [1, 4]])]  # groups 1 and 3
    asked = []

    def sample_round(k):
        asked.append(k)
        return rounds[k]

    sel = fill(sample_round, prompts=4, max_rounds=3)
    assert asked == [0, 1]
    assert sel.picks == [(0, 0), (0, 2), (1, 1), (1, 3)] and sel.trained.tolist() == [True] * 4
    assert sel.metrics() == {"dynamic/rounds": 2.0, "dynamic/dropped_groups": 4.0, "dynamic/padded_groups": 0.0}
    # more informative groups than slots: the batch takes the first ones, no further round runs
    sel = fill(lambda k: np.array([[0, 1]] * 6), prompts=4, max_rounds=3)
    assert sel.picks == [(0, g) for g in range(4)] and sel.rounds == 1


def test_fill_pads_with_dropped_groups_after_the_cap():
    sel = fill(lambda k: np.array([[1, 1], [0, 1], [2, 2]]), prompts=3, max_rounds=1)
    assert sel.rounds == 2 and sel.picks == [(0, 1), (1, 1), (0, 0)]
    assert sel.trained.tolist() == [True, True, False]
    assert sel.metrics() == {"dynamic/rounds": 2.0, "dynamic/dropped_groups": 4.0, "dynamic/padded_groups": 1.0}
    assert fill(lambda k: np.ones((2, 4)), prompts=2, max_rounds=0).trained.tolist() == [False, False]


def _completions(tag: int, rows: int, prompt_width: int, width: int) -> Completions:
    """Fake rollouts whose every value names its batch (tag) and row; row r shows r % 2 + 1 images of r + 1 patches."""
    counts = np.arange(rows) % 2 + 1
    grids = np.asarray([[1, 1, r + 1] for r in range(rows) for _ in range(counts[r])], np.int32)
    patches = np.concatenate([np.full((r + 1, 2), 1000 * tag + r, np.float32)
                              for r in range(rows) for _ in range(counts[r])])
    values = 1000 * tag + np.arange(rows)[:, None] + np.zeros((1, width), np.int32)
    return Completions(
        prompt_ids=(values[:, :1] + np.zeros((1, prompt_width), np.int32)).astype(np.int32),
        prompt_mask=np.ones((rows, prompt_width), np.int32), pixel_values=patches, image_grid_thw=grids,
        tokens=values.astype(np.int32), logprobs=-values.astype(np.float32), entropies=values.astype(np.float32),
        mask=np.ones((rows, width), np.int32), texts=tuple(f"{tag}/{r}" for r in range(rows)),
        offsets=tuple(((0, 1),) for _ in range(rows)), image_counts=counts.astype(np.int32),
    )


def test_take_rows_joins_batches_of_other_widths_with_their_images():
    a, b = _completions(1, 4, prompt_width=3, width=5), _completions(2, 4, prompt_width=6, width=2)
    got = take_rows([(a, [2, 3]), (b, [1]), (a, [0])], pad_id=-1)
    assert got.texts == ("1/2", "1/3", "2/1", "1/0")
    assert got.prompt_ids.shape == (4, 6) and got.tokens.shape == (4, 5)
    np.testing.assert_array_equal(got.prompt_ids[0], [-1, -1, -1, 1002, 1002, 1002])  # prompts left-padded
    np.testing.assert_array_equal(got.tokens[2], [2001, 2001, -1, -1, -1])  # completions right-padded
    np.testing.assert_array_equal(got.mask[2], [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(got.logprobs[3], [-1000] * 5)
    assert got.image_counts.tolist() == [1, 2, 2, 1]
    items, patches = got.item_starts()
    for row, (tag, r) in enumerate([(1, 2), (1, 3), (2, 1), (1, 0)]):
        rows_patches = got.pixel_values[patches[items[row]] : patches[items[row + 1]]]
        assert np.all(rows_patches == 1000 * tag + r) and len(rows_patches) == (r + 1) * (r % 2 + 1)
    # scored elsewhere (several processes): no texts to carry
    bare = dataclasses.replace(a, texts=(), offsets=())
    assert take_rows([(bare, [0]), (a, [1])], 0).texts == ()


@pytest.fixture
def job(tmp_path):
    from spatial_jax.rl.train import Trainer

    def make(*extra):
        return Trainer(C.load(TrainConfig, None, [f"run_dir={tmp_path}", *TINY, *extra]))
    return make


def _run_step(job, rewards_of_round, lengths=None):
    """One rl_step with rollouts and scores faked per round (`rewards_of_round[k]` [prompts, G]) and the update
    recorded instead of run; returns (metrics, the update's arguments, the rounds collect was asked for)."""
    G, prompts = job.cfg.rl.group_size, job.cfg.rl.prompts_per_step
    asked, seen = [], {}
    key = job.method.accuracy_key

    def collect(step, batch, sampling, round_=0, decoder=None):
        asked.append((round_, batch.tag))
        comps = _completions(round_, prompts * G, prompt_width=4 + round_, width=12)
        if lengths is not None:
            comps = dataclasses.replace(comps, mask=(np.arange(12)[None] < lengths[:, None]).astype(np.int32))
        # well-formed by the default method's (SpatialCORE's) own test, which every step's figures read
        scores = [{"reward": float(r), key: float(r > 0), "well_formed": 1.0, "think_close_count": 1.0}
                  for r in np.ravel(rewards_of_round[round_])]
        return Collected(comps, [], scores, prompts * G)

    def update(step, comps, adv, tx, n_micro, opt_state, temperature, trained=None, behaviour=None):
        seen.update(comps=comps, adv=adv, trained=trained)
        return opt_state, {"loss": 0.0, "train_tokens": 1.0}

    job.experience.collect, job.learner.update = collect, update
    job.experience.batches = iter([types.SimpleNamespace(records=(None,) * prompts, tag=k) for k in range(1, 10)])
    first = types.SimpleNamespace(records=(None,) * prompts, tag=0)
    out, _ = job.rl_step(0, first, types.SimpleNamespace(temperature=1.0), None, 1, None)
    return out, seen, asked


def test_rl_step_drops_all_equal_groups_and_keeps_the_batch_size(job):
    """Half the groups are all-equal in every round: they are dropped, the next batch of prompts refills the batch,
    every group trained carries a non-zero advantage, and the batch holds prompts_per_step x G rollouts."""
    trainer = job("rl.dynamic_sampling.enabled=true", "rl.prompts_per_step=4", "rl.group_size=2")
    half = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.2, 0.2]])
    out, seen, asked = _run_step(trainer, [half, half * 2, half * 3])
    assert asked == [(0, 0), (1, 1)]  # the second round reads the stage's next batch
    comps = seen["comps"]
    assert comps.tokens.shape == (8, 12) and np.all(seen["trained"])
    # rows 0-1, 4-5 of round 0, then rows 0-1, 4-5 of round 1 (each fake row's tokens name its round and row)
    np.testing.assert_array_equal(comps.tokens[:, 0], [0, 1, 4, 5, 1000, 1001, 1004, 1005])
    assert np.all(seen["adv"].reshape(4, 2) != 0)
    assert out["dynamic/rounds"] == 2 and out["dynamic/dropped_groups"] == 4 and out["dynamic/padded_groups"] == 0
    assert out["reward_mean"] == pytest.approx(np.mean([1, 0, 0, 1, 2, 0, 0, 2]), rel=1e-6)
    assert out["dynamic/reward_mean_sampled"] == pytest.approx(np.mean([half, half * 2]))
    assert out["host/prompts_read_max"] == 8 and out["host/rollouts_scored_max"] == 16


def test_rl_step_pads_after_the_cap_with_groups_that_carry_no_loss(job):
    trainer = job("rl.dynamic_sampling.enabled=true", "rl.dynamic_sampling.max_rounds=1", "rl.prompts_per_step=2",
                  "rl.group_size=2")
    equal = np.array([[1.0, 1.0], [0.0, 0.0]])
    out, seen, asked = _run_step(trainer, [np.array([[1.0, 1.0], [0.0, 1.0]]), equal])
    assert [k for k, _ in asked] == [0, 1]
    assert seen["trained"].tolist() == [True, True, False, False] and seen["comps"].tokens.shape[0] == 4
    assert out["dynamic/padded_groups"] == 1 and out["dynamic/dropped_groups"] == 3


def test_rl_step_without_dynamic_sampling_trains_the_first_batch_as_it_is(job):
    trainer = job("rl.prompts_per_step=2", "rl.group_size=2")
    out, seen, asked = _run_step(trainer, [np.array([[1.0, 1.0], [0.0, 1.0]])])
    assert asked == [(0, 0)] and seen["trained"] is None and not any(k.startswith("dynamic/") for k in out)
    assert "reward/overlong_penalty" not in out


def test_overlong_penalty_shapes_the_rewards_before_the_advantages(job):
    """L_max = 12 (max_new_tokens), L_cache = 4: rollouts of 8, 10, 12 and 5 tokens get 0, -1/2, -1 and 0, which
    turns the all-equal group (1, 1) into one with a gradient."""
    trainer = job("rl.prompts_per_step=2", "rl.group_size=2", "rl.overlong_penalty.cache=4")
    out, seen, _ = _run_step(trainer, [np.array([[1.0, 1.0], [0.0, 1.0]])], lengths=np.array([8, 10, 12, 5]))
    assert out["reward/overlong_penalty"] == pytest.approx(-1.5 / 4)
    assert out["reward_mean"] == pytest.approx((1 + 0.5 + (-1) + 1) / 4)
    np.testing.assert_allclose(seen["adv"], [0.25 / (0.25 + 1e-4), -0.25 / (0.25 + 1e-4), -1 / (1 + 1e-4),
                                             1 / (1 + 1e-4)], rtol=1e-5)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["rl.dynamic_sampling.enabled=true", "rl.group_size=1"],
         "rl.dynamic_sampling.enabled must be false with group_size=1: a group of one rollout never holds two"),
        (["rl.dynamic_sampling.max_rounds=-1"], "rl.dynamic_sampling.max_rounds must be >= 0, got -1"),
        (["rl.overlong_penalty.cache=9", "rl.overlong_penalty.max_length=8"],
         "rl.overlong_penalty.cache must be <= max_length=8"),
    ],
)
def test_options_refused_where_they_cannot_apply(overrides, match):
    with pytest.raises(C.ConfigError, match=match):
        C.load(TrainConfig, None, overrides)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["rl.overlong_penalty.cache=16", "rl.overlong_penalty.max_length=400"],
         r"rl.overlong_penalty.cache=16 never applies: .* L_max - L_cache = 384 .* = 288"),
        (["rl.overlong_penalty.cache=300"], r"rl.overlong_penalty.cache=300 must be <= L_max = 288"),
    ],
)
def test_overlong_penalty_machine_checks(overrides, match, tmp_path):
    cfg = C.load(TrainConfig, None, [f"run_dir={tmp_path}", *overrides])
    with pytest.raises(C.ConfigError, match=match):
        validate(cfg, num_devices=8)
    validate(C.load(TrainConfig, None, ["rl.overlong_penalty.cache=16"]), num_devices=8)


@pytest.mark.slow
def test_real_rounds_draw_afresh_and_padding_carries_no_loss(job):
    """On the tiny policy: a later round of the same prompts draws other tokens (its own random streams), rows of
    two rounds joined by take_rows go through the real update, and the rows dynamic sampling marks untrained
    carry no loss (those of one group here)."""
    import jax

    from spatial_jax.data.pipeline import train_iterator
    from spatial_jax.rl.optim import make_optimizer

    trainer = job("rl.prompts_per_step=2", "rl.group_size=2")
    batch = next(train_iterator(trainer.cfg.data, trainer.tok, trainer.method.prompt, 2,
                                image_cfg=trainer.policy.image_cfg))
    sampling = dataclasses.replace(trainer.cfg.rl.sampling, stop_token_ids=(trainer.tok.im_end_id,),
                                   pad_token_id=trainer.tok.pad_id)
    with jax.set_mesh(trainer.mesh):
        first, second = (trainer.experience.collect(0, batch, sampling, round_=k).completions for k in (0, 1))
        assert not np.array_equal(first.tokens, second.tokens)
        comps = take_rows([(first, [2, 3]), (second, [0, 1])], trainer.tok.pad_id)
        tx = make_optimizer(trainer.optim_config("rl"))
        _, out = trainer.learner.update(0, comps, np.array([1.0, -1.0, 0.0, 0.0], np.float32), tx, 1,
                                        tx.init(trainer.trainable), 1.0, np.array([True, True, False, False]))
    assert out["loss/num_seqs"] == 2 and out["loss/num_tokens"] == comps.mask[:2].sum()
