"""How a benchmark's protocol shows a question to the model: its options labelled by letters or numbers in the
protocol's form, and the answer instruction that follows. Each loader module defines its LAYOUT and says in its
docstring which source the layout follows; a policy is prompted with it (`Sample.prompt_text`), and its final
answer is read back against the record's answer through `label` (SpatiaLab's "2" is the record's "B")."""

from __future__ import annotations

import dataclasses

from spatial_jax.data.sample import LETTERS
from spatial_jax.suites.record import BenchRecord

LABELS = ("letters", "numbers")
# What `spatial-jax eval --benchmark --layout` shows a policy. "benchmark": each question as its protocol lays it out
# (the loader's LAYOUT). "method": as the method's own prompt shows a dataset's question (lettered options, no answer
# instruction), so a benchmark copy of a dataset's questions is asked word for word as `spatial-jax eval` asks them.
PROMPT_LAYOUTS = ("benchmark", "method")


@dataclasses.dataclass(frozen=True)
class Layout:
    """labels: "letters" (A, B, ...) or "numbers" (1, 2, ...). option: one option line, from {label} and {text}.
    header: the line before the options ("" for none). inline: the question text already lists its options (MindCube,
    SPAR-Bench), so none are added. choice / number: the answer instruction after a multiple-choice / numeric
    question, where {last} is the last option's label."""

    labels: str = "letters"
    option: str = "{label}. {text}"
    header: str = ""
    inline: bool = False
    choice: str = ""
    number: str = ""

    def __post_init__(self):
        if self.labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {self.labels!r}")

    def label(self, letter: str) -> str:
        """The record's option letter as this protocol labels it."""
        return letter if self.labels == "letters" else str(LETTERS.index(letter) + 1)

    def text(self, record: BenchRecord) -> str:
        """The question, its options and the answer instruction, as the protocol shows them."""
        lines = [record.question]
        choice = record.answer_type == "choice"
        if choice and not self.inline:
            lines += [self.header] if self.header else []
            lines += [self.option.format(label=self.label(LETTERS[i]), text=o) for i, o in enumerate(record.options)]
        instruction = self.choice if choice else self.number
        if instruction:
            last = self.label(LETTERS[max(len(record.options), 1) - 1])
            lines.append(instruction.format(last=last))
        return "\n".join(lines)
