"""Multi-turn tool rollouts through the engine equal the static sampler's, tool turns included.

The random tiny policy of test_rollout_multiturn rarely writes `</tool_call>`, so its output row for that token is
made a copy of the row of the token it draws most often: rows then stop at tool calls at varied points
(the call is malformed and answered with an error text), run tool turns and decode on. Tolerances: 1e-6 absolute on
log-probs, 1e-6 relative on entropies (near log V = 6.6 nats here, where a float32 ulp is 5e-7): the same float32
logits through gathered pages vs one buffer.
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from test_rollout_multiturn import MAX_TOOL, MAX_TURNS, setup  # noqa: F401 (setup: a fixture)

from spatial_jax.rollout import multiturn as mt


def _calling_model(model, common: int, call_end: int):
    """A copy of `model` whose `</tool_call>` output row (and embedding, when tied) is token `common`'s."""
    calling = nnx.clone(model)
    emb = calling.embed_tokens.embedding
    emb[...] = emb[...].at[call_end].set(emb[...][common])
    if calling.lm_head is not None:
        calling.lm_head[...] = calling.lm_head[...].at[:, call_end].set(calling.lm_head[...][:, common])
    return calling


@pytest.mark.slow
def test_multiturn_engine_equals_static_path(setup):  # noqa: F811 (fixture)
    policy, batch, sampling = setup
    tok = policy.tokenizer
    with jax.set_mesh(policy.mesh):
        def run(model, cfg):  # the shapes of test_rollout_multiturn's rollouts: the static path compiles once
            return mt.sample_multiturn(model, batch, tok, cfg, group_size=2, seed=5, max_turns=MAX_TURNS,
                                       max_tool_tokens=MAX_TOOL)

        first = run(policy.model, sampling)
        drawn = first.tokens[first.mask > 0]
        model = _calling_model(policy.model, int(np.bincount(drawn).argmax()), tok.tool_call_end_id)
        static = run(model, sampling)
        paged = run(model, dataclasses.replace(sampling, engine="paged", slots=3, page_size=16, chunk=8))
    assert static.num_tool_calls.sum() > 0 and static.num_tool_calls.max() <= MAX_TURNS
    assert static.texts == paged.texts
    for f in ("tokens", "mask", "context_mask", "num_tool_calls", "num_tool_pictures", "image_counts"):
        np.testing.assert_array_equal(getattr(paged, f), getattr(static, f), err_msg=f)
    np.testing.assert_allclose(paged.logprobs, static.logprobs, atol=1e-6)
    np.testing.assert_allclose(paged.entropies, static.entropies, rtol=1e-6)  # ~6.6 nats: float32 ulp ~5e-7
