"""Prompt formats: the system prompt that asks for an output format (SPEC 1.1-1.3) and the user turn.

Messages use the Hugging Face chat form ({"role", "content"}, content parts {"type": "image"} / {"type": "video"} /
{"type": "text"}): a sample's images (in order) or its video come before the text, as in Qwen3-VL's examples.
"""

from __future__ import annotations

import dataclasses

from spatial_jax.data.sample import LETTERS, Sample

BOX_EXAMPLE = '{"bbox_2d": [x1, y1, x2, y2], "label": "object name"}'

SPATIALCORE_SYSTEM = (
    "You are a careful visual spatial reasoning assistant. Your reasoning is already open. Begin it by locating "
    "every object the question depends on, one per line, exactly as " + BOX_EXAMPLE + ", with integer "
    "coordinates from 0 to 1000 in the image's normalised frame (x grows to the right, y grows downward). "
    "Give at most one box per object, and never box directions, distances or other spatial words. Then reason "
    "step by step about where the objects are. Close the reasoning with </think> and write only the final "
    "answer after it: the capital letter of the correct option, or the number when the question asks for one."
)

# ProSR App. A.6 (its annotation prompt, SPEC 8): grounded reasoning in a few short steps, then one option letter;
# no boxes are asked for, so none enter its entropy trajectories
PROSR_SYSTEM = (
    "You are an expert in spatial reasoning and visual understanding. Your reasoning is already open. State the "
    "task briefly first, then reason in 3 to 6 short steps, each grounded in visible objects, viewpoints or "
    "relative spatial relations (left, right, above, below, in front of, behind, beside, clockwise). Use only the "
    "evidence the question needs; do not repeat descriptions, change your mind without new evidence, or invent "
    "objects. Close the reasoning with </think> and write exactly one capital letter after it, the correct "
    "option (a question without options: the number it asks for), and nothing after it."
)

SPATIALTHINKER_SYSTEM = (
    "You are a visual spatial reasoning assistant. Reply in four tagged parts, in this order: "
    "<observe> what the image shows </observe>, then <scene> a JSON scene graph of the objects the question "
    'needs, {"objects": [{"id": "name.1", "bbox": [x1, y1, x2, y2]}], "relationships": [{"subject": "name.1", '
    '"predicate": "left of", "object": "name.2"}]}, with boxes in pixels of the stated image size and ids made of '
    "a name, a dot and a number </scene>, then <think> your reasoning </think>, and last <answer> the chosen "
    "option written as (X) option text, or the number when the question asks for one </answer>."
)

ALLOSPATIAL_SYSTEM = (
    "You are a spatial reasoning agent. Work in numbered steps. Step1: Visual Clues: describe what the image "
    "shows that bears on the question. When a tool is available, call it in its own step (Step2.x for the world "
    "map, Step3.x for a new view) as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, and after any "
    "tool use compare the evidence in Step4: Cross-Validation. Finish with Step5: Final Answer and put the answer "
    "in <Answer></Answer>: the capital letter of the correct option, or a number when the question asks for one.\n"
    "Tools:\n"
    "- world2mind: the allocentric map of the named objects. Arguments: {\"categories\": [object names], "
    "\"knowledge_type\": \"landmark\" | \"route\" | \"both\", \"output_format\": \"rectangle\" | \"ellipse\", "
    "\"scene_type\": \"indoor\" | \"outdoor\"}\n"
    "- view_image: a rendered top-down picture of the map. Arguments: {\"visualization_type\": \"landmark_vis\" | "
    "\"route_vis\"}"
)

@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a method asks for its output: the data layer reads this, never a method's name.

    system: the system prompt (SPEC 1.1-1.3). thinking: the chat template opens `<think>\\n` for the assistant
    (Qwen3-VL-Thinking style). states_image_size: the user turn states `Image size: (W x H)`, which pixel boxes refer
    to. option_style: how a lettered option is written. reference_key: the key of `Sample.reference` that holds this
    method's SFT target.
    """

    system: str
    thinking: bool
    reference_key: str
    states_image_size: bool = False
    option_style: str = "{letter}. {text}"


THINK_BOXES = PromptFormat(SPATIALCORE_SYSTEM, thinking=True, reference_key="spatialcore")
THINK_LETTER = PromptFormat(PROSR_SYSTEM, thinking=True, reference_key="prosr")
SCENE_GRAPH = PromptFormat(SPATIALTHINKER_SYSTEM, thinking=False, reference_key="spatialthinker",
                           states_image_size=True, option_style="({letter}) {text}")
HARNESS = PromptFormat(ALLOSPATIAL_SYSTEM, thinking=False, reference_key="allospatial")


def user_text(sample: Sample, fmt: PromptFormat) -> str:
    """The question, its lettered options (or a benchmark's own layout of both), and (SpatialThinker) the stated
    image size its pixel boxes refer to."""
    lines = []
    if fmt.states_image_size and (sample.image_refs or sample.video is not None):  # a text-only row has no size
        if sample.image_size is None:
            raise ValueError(f"sample {sample.id}: this prompt states the image size, which is unknown")
        w, h = sample.image_size
        lines.append(f"Image size: ({w} x {h})")
    if sample.prompt_text:
        return "\n".join([*lines, sample.prompt_text])
    lines.append(sample.question)
    if sample.options:
        lines.append("Options:")
        lines.extend(fmt.option_style.format(letter=LETTERS[i], text=o) for i, o in enumerate(sample.options))
    return "\n".join(lines)


def build_messages(sample: Sample, fmt: PromptFormat) -> list[dict]:
    """System + user turns for one sample; the generation prompt is added by the chat template."""
    visual = [{"type": "video"}] if sample.video is not None else [{"type": "image"} for _ in sample.image_refs]
    return [
        {"role": "system", "content": fmt.system},
        {"role": "user", "content": [*visual, {"type": "text", "text": user_text(sample, fmt)}]},
    ]
