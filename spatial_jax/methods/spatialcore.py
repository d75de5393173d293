"""SpatialCORE: confidence-weighted box reward gated by the answer (SPEC 2); boxes open the Thinking-style reasoning."""

from spatial_jax.data.prompts import THINK_BOXES
from spatial_jax.methods.base import Method, register
from spatial_jax.rewards import parse_think, spatialcore

register(Method(
    name="spatialcore",
    config_cls=spatialcore.SpatialCOREConfig,
    score_batch=spatialcore.score_batch,
    reference="spatial_jax.reference.spatialcore_torch:score_batch",
    prompt=THINK_BOXES,
    accuracy_key="r_ans",
    well_formed=lambda c: c["well_formed"] > 0 and c["think_close_count"] == 1,
    final_answer=parse_think.final_answer,
    box_details=spatialcore.box_details,
))
