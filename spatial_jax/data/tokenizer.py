"""A small byte-level BPE tokenizer in the Qwen3-VL shape, trained locally on the synthetic world's text.

Qwen's pre-tokenizer regex (every digit its own pre-token, so `734` is always three digit tokens, SPEC 1.1) then
byte-level BPE, so any string round-trips. Special tokens and the chat template follow Qwen3-VL. The vocabulary is
deterministic: the corpus is a fixed slice of the synthetic world plus the prompt templates. Wrapped as a
transformers.PreTrainedTokenizerFast (`.hf`) so it saves and loads with save_pretrained / from_pretrained.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from spatial_jax.data import prompts, synthetic

# Qwen2/Qwen3 pre-tokenizer pattern: contractions, words with one leading non-letter, single digits, punctuation runs.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
THINK, THINK_END, TOOL_CALL, TOOL_CALL_END = "<think>", "</think>", "<tool_call>", "</tool_call>"
# Control tokens are special (skipped by skip_special_tokens); the reasoning/tool tags are plain added tokens, as in
# Qwen3, so they survive in decoded completions that the rewards parse.
CONTROL_TOKENS = (PAD, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
TAG_TOKENS = (THINK, THINK_END, TOOL_CALL, TOOL_CALL_END)
IMAGE_BLOCK = VISION_START + IMAGE_PAD + VISION_END
DEFAULT_VOCAB_SIZE = 768  # a multiple of 64 (embedding and logit tiles)
CORPUS_SEED = 20240601
CORPUS_SAMPLES = 400

# Qwen3-VL's chat template shape: one image placeholder block per image part (expanded afterwards to the image's
# token count), one video block per video part (its pad expanded afterwards to timestamped frame blocks),
# `<|im_start|>assistant\n` as generation prompt, `<think>\n` appended for the Thinking style.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-unicode table, inverted: the character a byte-level token uses for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def corpus() -> list[str]:
    """The training text: prompts, questions and every method's reference completion from a fixed world slice."""
    cfg = synthetic.SyntheticConfig(question_types=synthetic.QUESTION_TYPES, seed=CORPUS_SEED, corrupt_fraction=0.4)
    # The Thinking format's prompt and reference count twice (SpatialCORE and ProSR share them): the vocabulary was
    # first trained on that corpus, and the merges depend on the counts.
    formats = (prompts.THINK_BOXES, prompts.SCENE_GRAPH, prompts.HARNESS)
    weighted = (prompts.THINK_BOXES, *formats)
    texts = [f.system for f in weighted]
    for s in synthetic.generate(cfg, "train", CORPUS_SAMPLES, render_image=False):
        for fmt in formats:
            texts.append(prompts.user_text(s, fmt))
        texts.extend(s.reference[f.reference_key] for f in weighted)
    return texts


class SpatialTokenizer:
    """encode / decode / decode_with_offsets plus the special ids the sampler and trainer need."""

    def __init__(self, hf):
        self.hf = hf
        ids = {t: hf.convert_tokens_to_ids(t) for t in CONTROL_TOKENS + TAG_TOKENS}
        missing = [t for t, i in ids.items() if i is None or i == hf.unk_token_id]
        if missing:
            raise ValueError(f"tokenizer lacks the special tokens {missing}")
        self.pad_id = ids[PAD]
        self.im_start_id = ids[IM_START]
        self.im_end_id = ids[IM_END]
        self.eos_id = self.im_end_id  # a chat turn ends at <|im_end|>
        self.vision_start_id = ids[VISION_START]
        self.vision_end_id = ids[VISION_END]
        self.image_pad_id = ids[IMAGE_PAD]
        self.video_pad_id = ids[VIDEO_PAD]
        self.think_id = ids[THINK]
        self.think_end_id = ids[THINK_END]
        self.tool_call_id = ids[TOOL_CALL]
        self.tool_call_end_id = ids[TOOL_CALL_END]
        self.control_ids = frozenset(ids[t] for t in CONTROL_TOKENS)
        self.vocab_size = len(hf)
        self.digit_ids = tuple(hf.convert_tokens_to_ids(str(d)) for d in range(10))
        table = _byte_decoder()
        added = {tok.content: i for i, tok in hf.added_tokens_decoder.items()}
        self._bytes: list[bytes] = [b""] * self.vocab_size
        for token, i in hf.get_vocab().items():
            if token in added:
                self._bytes[i] = token.encode("utf-8")
            else:
                self._bytes[i] = bytes(table[c] for c in token)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids, nothing is added around it."""
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int], skip_control: bool = False) -> str:
        return self.decode_with_offsets(token_ids, skip_control)[0]

    def model_token_ids(self) -> dict[str, int]:
        """The ids a Qwen3-VL model config names, keyed as its fields are."""
        return {
            "image_token_id": self.image_pad_id,
            "video_token_id": self.video_pad_id,
            "vision_start_token_id": self.vision_start_id,
            "vision_end_token_id": self.vision_end_id,
        }

    def trim_completion(self, token_ids: Sequence[int]) -> list[int]:
        """A sampled completion up to (not including) its first <|im_end|> or <|endoftext|>: the text the rewards
        score ends at the answer, so the stop token must not count as text after it."""
        out = []
        for t in token_ids:
            if int(t) in (self.im_end_id, self.pad_id):
                break
            out.append(int(t))
        return out

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[self._check_id(token_id)]

    def _check_id(self, token_id) -> int:
        i = int(token_id)
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} is outside the tokenizer's vocabulary [0, {self.vocab_size})")
        return i

    def decode_with_offsets(
        self, token_ids: Sequence[int], skip_control: bool = False
    ) -> tuple[str, list[tuple[int, int]]]:
        """(text, [start, end) character span of each token). The spans tile the text in order: a character belongs
        to the token holding its last byte (so a token carrying only the first bytes of a character is empty).
        skip_control drops <|im_end|>, <|endoftext|>, <|im_start|> and the vision tokens from the text (their spans
        are empty).
        Invalid UTF-8 becomes U+FFFD, as the Hugging Face decoder does."""
        pieces = []
        for t in token_ids:
            i = self._check_id(t)
            pieces.append(b"" if skip_control and i in self.control_ids else self._bytes[i])
        data = b"".join(pieces)
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        byte_end = np.cumsum(lengths)
        byte_start = byte_end - lengths
        try:
            text = data.decode("utf-8")
            raw = np.frombuffer(data, dtype=np.uint8)
            # byte k ends a character when the next byte is not a continuation byte (10xxxxxx)
            ends = np.ones(len(raw), dtype=np.int64)
            ends[:-1] = (raw[1:] & 0xC0) != 0x80
            chars_before = np.concatenate([[0], np.cumsum(ends)])
        except UnicodeDecodeError:
            text, chars_before = _lossy(data)
        starts = chars_before[byte_start].tolist()
        stops = chars_before[byte_end].tolist()
        return text, list(zip(starts, stops))

    def apply_chat_template(
        self,
        messages: list[dict],
        image_token_counts: Sequence[int] = (),
        add_generation_prompt: bool = True,
        enable_thinking: bool = False,
        video_placeholders: Sequence[str] = (),
    ) -> str:
        """The Qwen3-VL prompt text; the k-th image block gets image_token_counts[k] `<|image_pad|>` tokens and the
        k-th video's `<|video_pad|>` becomes video_placeholders[k] (its timestamped frame blocks)."""
        text = self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
        )
        return expand_video_pads(expand_image_pads(text, image_token_counts), video_placeholders)

    def save(self, directory: str | Path) -> None:
        self.hf.save_pretrained(str(directory))

    @staticmethod
    def load(directory: str | Path) -> SpatialTokenizer:
        from transformers import PreTrainedTokenizerFast

        return SpatialTokenizer(PreTrainedTokenizerFast.from_pretrained(str(directory)))


def _lossy(data: bytes) -> tuple[str, np.ndarray]:
    """Decodes invalid UTF-8 byte by byte, recording how many characters exist after each byte."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = []
    counts = [0]
    n = 0
    for k in range(len(data)):
        piece = dec.decode(data[k : k + 1], final=(k == len(data) - 1))
        out.append(piece)
        n += len(piece)
        counts.append(n)
    return "".join(out), np.asarray(counts, dtype=np.int64)


def expand_image_pads(text: str, image_token_counts: Sequence[int]) -> str:
    """Replaces the k-th `<|vision_start|><|image_pad|><|vision_end|>` block by one with image_token_counts[k] pads."""
    parts = text.split(IMAGE_BLOCK)
    counts = [int(c) for c in image_token_counts]
    if len(parts) - 1 != len(counts):
        raise ValueError(f"the prompt has {len(parts) - 1} image placeholder(s) but {len(counts)} token count(s)")
    if any(c < 1 for c in counts):
        raise ValueError(f"every image needs at least one token, got counts {counts}")
    out = [parts[0]]
    for c, rest in zip(counts, parts[1:]):
        out.append(VISION_START + IMAGE_PAD * c + VISION_END + rest)
    return "".join(out)


def expand_video_pads(text: str, placeholders: Sequence[str]) -> str:
    """Replaces the k-th `<|video_pad|>` by placeholders[k]. The chat template's block around it,
    `<|vision_start|><|video_pad|><|vision_end|>`, goes with it: every frame group carries its own block, and an outer
    one would nest them (Qwen3-VL's released processor and transformers >= 5.25 drop it; 5.0-5.24 kept it)."""
    parts = text.split(VIDEO_PAD)
    if len(parts) - 1 != len(placeholders):
        raise ValueError(f"the prompt has {len(parts) - 1} video placeholder(s) but {len(placeholders)} video(s)")
    for k in range(len(placeholders)):
        if parts[k].endswith(VISION_START) and parts[k + 1].startswith(VISION_END):
            parts[k] = parts[k][: -len(VISION_START)]
            parts[k + 1] = parts[k + 1][len(VISION_END) :]
    out = [parts[0]]
    for p, rest in zip(placeholders, parts[1:]):
        out.append(p + rest)
    return "".join(out)


@functools.lru_cache(maxsize=4)
def build_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> SpatialTokenizer:
    """The project tokenizer, trained in-process (about a second) and cached; same vocabulary on every call."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (256 bytes + special tokens + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        min_frequency=1,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = corpus()
    # The tags are trained around, not through: strip them so no merge spans a tag's characters.
    tag_re = re.compile("|".join(re.escape(t) for t in CONTROL_TOKENS + TAG_TOKENS))
    tok.train_from_iterator([tag_re.sub("\n", t) for t in texts], trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=IM_END,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
    hf.padding_side = "left"
    hf.chat_template = CHAT_TEMPLATE
    return SpatialTokenizer(hf)
