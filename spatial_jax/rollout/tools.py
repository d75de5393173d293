"""AlloSpatial's tools as the policy calls them: the harness schema's name and required arguments, answered from
the sample by data/world_map.py (World2Mind's map, the rendered top-down view).

A tool is called as `tool(arguments, sample) -> str` (the text the model reads) and `tool.picture(arguments,
sample)` (an RGB uint8 array that the rollout puts into the next turn for the vision tower, or None); every problem
(a missing argument, an unknown value, nothing to map) comes back as an "Error: ..." text, never as an exception.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import numpy as np

from spatial_jax.data import world_map as wm
from spatial_jax.data.world_map import error
from spatial_jax.rewards.parse_harness import VIEW_IMAGE, WORLD2MIND, ToolCall, ToolSchema


class Tool(abc.ABC):
    """A callable tool with the harness schema's name and required arguments; subclasses implement `run` (and
    `answer` when they answer with a picture too) on arguments that hold every required key."""

    schema: ToolSchema

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def required(self) -> tuple[str, ...]:
        return self.schema.required

    def respond(self, arguments: Any, sample) -> tuple[str, np.ndarray | None]:
        """(text, picture or None) for any arguments."""
        if not isinstance(arguments, Mapping):
            return error(f"{self.name} takes a JSON object of arguments"), None
        missing = [k for k in self.required if arguments.get(k) in (None, "", [], {})]
        if missing:
            return error(f"{self.name} is missing required argument(s): {', '.join(missing)}"), None
        return self.answer(arguments, sample)

    def __call__(self, arguments: Mapping[str, Any], sample) -> str:
        return self.respond(arguments, sample)[0]

    def picture(self, arguments: Mapping[str, Any], sample) -> np.ndarray | None:
        return self.respond(arguments, sample)[1]

    def answer(self, arguments: Mapping[str, Any], sample) -> tuple[str, np.ndarray | None]:
        """(text or an `error(...)` text, picture or None) on arguments that hold every required key; a tool that
        answers with text only needs just `run`."""
        return self.run(arguments, sample), None

    @abc.abstractmethod
    def run(self, arguments: Mapping[str, Any], sample) -> str:
        """The tool's text output (or an `error(...)` text)."""


class World2Mind(Tool):
    """World2Mind(C, k, f, s) (AlloSpatial §3.2): the requested categories' landmark AST and/or route knowledge."""

    schema = WORLD2MIND

    def run(self, arguments: Mapping[str, Any], sample) -> str:
        return wm.world2mind(arguments, sample)


class ViewImage(Tool):
    """The rendered top-down visualisation (`landmark_vis` or `route_vis`) with its caption."""

    schema = VIEW_IMAGE

    def answer(self, arguments: Mapping[str, Any], sample) -> tuple[str, np.ndarray | None]:
        return wm.view(arguments, sample)

    def run(self, arguments: Mapping[str, Any], sample) -> str:
        return wm.view(arguments, sample)[0]


def default_tools() -> dict[str, Tool]:
    """The registry: tool name -> tool, one per harness schema."""
    return {tool.name: tool for tool in (World2Mind(), ViewImage())}


def _tool_of(call: ToolCall | None, tools: Mapping[str, Tool]) -> Tool | str:
    if call is None:
        return error("no complete tool call was found in this turn")
    if call.name is None or call.arguments is None:
        return error("the tool call is not valid JSON of the form {\"name\": ..., \"arguments\": {...}}")
    tool = tools.get(call.name)
    if tool is None:
        return error(f"unknown tool {wm.clean(call.name)!r}; available: {', '.join(sorted(tools))}")
    return tool


def run_call(call: ToolCall | None, tools: Mapping[str, Tool], sample) -> str:
    """The text a parsed `<tool_call>` gets back: the tool's output, or an error for a call that cannot run."""
    tool = _tool_of(call, tools)
    return tool if isinstance(tool, str) else tool(call.arguments, sample)


def run_call_with_picture(call: ToolCall | None, tools: Mapping[str, Tool], sample) -> tuple[str, np.ndarray | None]:
    """(text, picture or None): what a parsed call gets back in a rollout."""
    tool = _tool_of(call, tools)
    return (tool, None) if isinstance(tool, str) else tool.respond(call.arguments, sample)
