"""ProSR: answer + format minus entropy-trajectory penalties (SPEC 3); reasoning, `</think>` and one letter, no
boxes (App. A.6, SPEC 8), and one blank-image rollout per prompt for the counterfactual term (eq. 8)."""

from spatial_jax.data.prompts import THINK_LETTER
from spatial_jax.methods.base import Method, register
from spatial_jax.rewards import parse_think, prosr

register(Method(
    name="prosr",
    config_cls=prosr.ProSRConfig,
    score_batch=prosr.score_batch,
    reference="spatial_jax.reference.prosr_torch:score_batch",
    prompt=THINK_LETTER,
    accuracy_key="r_acc",
    well_formed=lambda c: c["r_fmt"] > 0,
    final_answer=parse_think.final_answer,
    needs_blank=True,
))
