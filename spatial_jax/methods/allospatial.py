"""AlloSpatial: harness-gated trajectory reward (SPEC 5) over multi-turn rollouts that call tools; its SFT targets
call the tools where the sample has a scene map (methods/harness_targets.py)."""

from spatial_jax.data.prompts import HARNESS
from spatial_jax.data.tool_turns import register_target
from spatial_jax.methods.base import Method, register
from spatial_jax.methods.harness_targets import tool_target
from spatial_jax.rewards import allospatial, parse_harness

register(Method(
    name="allospatial",
    config_cls=allospatial.AlloSpatialConfig,
    score_batch=allospatial.score_batch,
    reference="spatial_jax.reference.allospatial_torch:score_batch",
    prompt=HARNESS,
    accuracy_key="accuracy_ungated",
    well_formed=lambda c: c["structure"] >= 0.85,
    final_answer=parse_harness.final_answer,
    uses_tools=True,
))
register_target(HARNESS.reference_key, tool_target)
