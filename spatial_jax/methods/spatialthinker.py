"""SpatialThinker: scene-graph output scored by format, count, accuracy and CIoU-matched boxes (SPEC 4)."""

from spatial_jax.data.prompts import SCENE_GRAPH
from spatial_jax.methods.base import Method, register
from spatial_jax.rewards import parse_scene, spatialthinker

register(Method(
    name="spatialthinker",
    config_cls=spatialthinker.SpatialThinkerConfig,
    score_batch=spatialthinker.score_batch,
    reference="spatial_jax.reference.spatialthinker_torch:score_batch",
    prompt=SCENE_GRAPH,
    accuracy_key="accuracy",
    well_formed=lambda c: c["format"] > 0,
    final_answer=parse_scene.final_answer,
))
