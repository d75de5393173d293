"""SpatialCORE's recipe (Table 4): the vision tower frozen in the SFT cold start, its LoRA adapters trained in RL.

With policy.train_vision and sft.train_vision = false, an SFT step (no warm-up, so it moves weights) leaves every
vision weight bit-identical while the language adapters move; the SFT checkpoint reads back for evaluation; one RL
update on the same policy moves the vision adapters; and the same SFT step with sft.train_vision = true moves them
(the switch is what froze them).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spatial_jax.data.pipeline import DataConfig, train_iterator
from spatial_jax.models.config import LoRAConfig
from spatial_jax.rl import step as st
from spatial_jax.rl.config import EvalConfig, PolicyConfig, RLConfig, SFTConfig, TrainConfig
from spatial_jax.rl.learner import full_seq_batch
from spatial_jax.rl.losses import loss_denominator
from spatial_jax.rl.optim import OptimConfig
from spatial_jax.rl.train import Trainer
from spatial_jax.rl.workspace import Workspace


def _leaves(state, vision: bool) -> dict[str, np.ndarray]:
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(state):
        if any(getattr(k, "key", None) == "visual" for k in path) == vision:
            out[jax.tree_util.keystr(path)] = np.asarray(x).copy()
    return out


def _same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = TrainConfig(
        run_dir=str(tmp_path_factory.mktemp("frozen_vision")), method="spatialcore",
        policy=PolicyConfig(train_vision=True, lora=LoRAConfig(rank=4, alpha=8.0, dropout=0.0, vision_rank=2,
                                                               vision_alpha=4.0)),
        data=DataConfig(train="synthetic:train:8", eval="synthetic:heldout:4", bucket_lengths=(512, 1024)),
        sft=SFTConfig(steps=1, batch_size=2, train_vision=False, optim=OptimConfig(lr=1e-2, warmup_ratio=0.0)),
        rl=RLConfig(steps=1, optim=OptimConfig(lr=1e-2, warmup_ratio=0.0)),
        eval=EvalConfig(after_sft=False, after_rl=False),
        tensorboard=False, progress=False, export_hf=False,
    )
    trainer = Trainer(cfg)
    vision0, text0 = _leaves(trainer.trainable, True), _leaves(trainer.trainable, False)
    assert vision0 and text0  # the vision adapters are trainable weights, frozen by the SFT optimiser alone
    with jax.set_mesh(trainer.mesh):
        trainer.sft()
    return cfg, trainer, vision0, text0


def _sft_batch(trainer, cfg):
    it = train_iterator(cfg.data, trainer.tok, trainer.method.prompt, 2, mode="sft", image_cfg=trainer.policy.image_cfg)
    return full_seq_batch(trainer.policy.model.cfg, next(it))


def test_sft_leaves_the_vision_tower_bit_identical(trained):
    cfg, trainer, vision0, text0 = trained
    assert _same_bits(_leaves(trainer.trainable, True), vision0)
    assert not _same_bits(_leaves(trainer.trainable, False), text0)
    # evaluation reads the SFT checkpoint back (its optimiser state has the frozen layout)
    ws = Workspace(cfg)
    assert ws.load_latest() == "sft"
    assert _same_bits(_leaves(ws.trainable, True), vision0)
    assert _same_bits(_leaves(ws.trainable, False), _leaves(trainer.trainable, False))


def test_the_switch_is_what_freezes_the_vision_tower(trained):
    """With sft.train_vision = true the SFT optimiser keeps Adam moments for every vision weight (so it moves
    them); with false it keeps none (the tower gets a zero update)."""
    cfg, trainer, vision0, text0 = trained

    def moments(train_vision: bool) -> int:
        tx = trainer.optimizer("sft", dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft,
                                                                                       train_vision=train_vision)))
        return len(jax.tree_util.tree_leaves(tx.init(trainer.trainable)))

    assert moments(True) - moments(False) == 2 * len(vision0)  # mu and nu of each vision weight


def test_rl_trains_the_vision_adapters(trained):
    cfg, trainer, vision0, _ = trained
    seq = _sft_batch(trainer, cfg)
    tx = trainer.optimizer("rl")
    with jax.set_mesh(trainer.mesh):
        params = jax.tree.map(jnp.copy, trainer.trainable)
        old = jnp.zeros(seq.target_mask.shape, jnp.float32)  # ratio < 1: the positive advantage's row has gradient
        data = st.RLData(seq=seq, old_logp=old, ref_logp=old,
                         advantages=jnp.asarray([1.0, -1.0]),
                         normalizer=loss_denominator(seq.target_mask, cfg.rl.loss.aggregation))
        params, _, _, metrics, _ = st.rl_update(trainer.graphdef, params, trainer.frozen, tx.init(params), data,
                                             cfg.rl.loss, 1.0, tx, None)
    moved = [k for k, v in _leaves(params, True).items() if not np.array_equal(v, vision0[k])]
    assert float(metrics["grad_norm"]) > 0 and any("lora_b" in k for k in moved)
