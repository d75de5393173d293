"""AlloSpatial SFT targets that use the tools, for samples with a scene map of their own (the synthetic world).

The paper's cold start trains on harness trajectories that call World2Mind, read its map, look at the rendered
view and cross-check before answering (AlloSpatial §3.4, App. D). This builds one such trajectory per sample from
what the sample knows: Step1 names the objects the answer rests on; Step2.1 calls world2mind on them and reads back
the AST the live tool returns; Step3.1 calls view_image (landmark_vis) and sees the rendered
picture the live tool returns; Step4 quotes the map's centres and sizes of those objects; Step5 answers as the
sample's annotator did (`meta["annotated_answer"]`, else the gold answer), as its other formats' targets do. Tool
outputs come from data/world_map.py, as the rollout's tools answer, and are tool turns (no loss).

A sample without `meta["objects"]` and `meta["relevant"]` (the objects its answer rests on) keeps its own reference
completion.
"""

from __future__ import annotations

import json

from spatial_jax.data import world_map as wm
from spatial_jax.data.sample import Sample, format_number
from spatial_jax.data.tool_turns import TargetPart, ToolTurn
from spatial_jax.rewards.parse_harness import VIEW_IMAGE, WORLD2MIND, ToolSchema

MAP_ARGUMENTS = {"knowledge_type": "landmark", "output_format": "rectangle", "scene_type": "indoor"}
VIEW_ARGUMENTS = {"visualization_type": "landmark_vis"}


def call_text(schema: ToolSchema, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": schema.name, "arguments": arguments}) + "</tool_call>"


def _map_clues(objects: list[dict]) -> str:
    """The map's numbers for the objects, as the AST writes them (centre, width, height in [0, 1000])."""
    clues = []
    for o in objects:
        x1, y1, x2, y2 = o["box"]
        clues.append(f"{o['label']} at ({wm.fmt_num((x1 + x2) / 2)}, {wm.fmt_num((y1 + y2) / 2)}) "
                     f"size {wm.fmt_num(x2 - x1)} x {wm.fmt_num(y2 - y1)}")
    return "The map puts the " + "; the ".join(clues) + "."


def tool_target(sample: Sample) -> list[TargetPart] | None:
    """The harness trajectory with a world2mind and a view_image call, or None without the scene knowledge."""
    meta = sample.meta or {}
    relevant = list(dict.fromkeys(str(label) for label in meta.get("relevant") or ()))
    objects = wm.scene_objects(sample)
    if not relevant or not meta.get("objects") or isinstance(objects, str):
        return None
    map_args = {"categories": relevant, **MAP_ARGUMENTS}
    ast = wm.world2mind(map_args, sample)
    caption, picture = wm.view(VIEW_ARGUMENTS, sample)
    if ast.startswith("Error: ") or picture is None:
        return None
    named = [o for o in objects if o["label"] in relevant]
    # the annotator's answer where the world has one (a biased annotator's, data/synthetic/annotations.py): the
    # targets of every format carry it alike, while the tools answer the truth
    answer = meta.get("annotated_answer", sample.answer)
    final = answer if isinstance(answer, str) else format_number(answer)
    return [
        f"Step1: Visual Clues\nThe answer rests on where the {' and the '.join(relevant)} are: I need the map.\n"
        f"Step2.1: World Map\n{call_text(WORLD2MIND, map_args)}",
        ToolTurn(ast),
        f"Step3.1: View Image\n{call_text(VIEW_IMAGE, VIEW_ARGUMENTS)}",
        ToolTurn(caption, picture),
        f"Step4: Cross-Validation\n{_map_clues(named)} The top-down view agrees with the image.\n"
        f"Step5: Final Answer\n<Answer>{final}</Answer>",
    ]
