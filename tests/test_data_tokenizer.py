"""The local Qwen3-VL-shaped tokenizer: lossless round trip, single-digit tokens, offsets that tile the text,
special ids, the chat template's image pads, save/load, and a deterministic vocabulary."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spatial_jax.data import prompts, synthetic
from spatial_jax.data import tokenizer as T


@pytest.fixture(scope="module")
def tok():
    return T.build_tokenizer()


SPECIALS = list(T.CONTROL_TOKENS + T.TAG_TOKENS)
text_with_tags = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(SPECIALS)), max_size=6).map("".join)


@settings(max_examples=200, deadline=None)
@given(s=text_with_tags)
def test_round_trip_any_text(tok, s):
    ids = tok.encode(s)
    assert tok.decode(ids) == s
    assert tok.hf.decode(ids, skip_special_tokens=False) == s


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_offsets_tile_text_and_match_hf_decode(tok, data):
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=30))
    text, spans = tok.decode_with_offsets(ids)
    assert text == tok.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert len(spans) == len(ids)
    pos = 0
    for a, b in spans:
        assert a == pos and b >= a
        pos = b
    assert pos == len(text)


def test_offsets_of_a_completion(tok):
    c = synthetic.make_sample(synthetic.SyntheticConfig(), "train", 3, render_image=False).reference["spatialcore"]
    ids = tok.encode(c)
    text, spans = tok.decode_with_offsets(ids)
    assert text == c
    for i, (a, b) in zip(ids, spans):
        assert text[a:b] == tok.token_bytes(i).decode("utf-8")
    think = ids.index(tok.think_end_id)
    assert text[spans[think][0]:spans[think][1]] == "</think>"
    # multi-byte characters belong to the token that completes them; the others are empty
    ids = tok.encode("é😀x")
    text, spans = tok.decode_with_offsets(ids)
    assert text == "é😀x" and spans[-1] == (2, 3) and sum(b - a for a, b in spans) == 3


def test_digits_are_single_tokens(tok):
    assert len(set(tok.digit_ids)) == 10 and all(i is not None for i in tok.digit_ids)
    ids = tok.encode('{"bbox_2d": [734, 5, 1000, 86]}')
    pieces = [tok.token_bytes(i).decode() for i in ids]
    assert [p for p in pieces if any(ch.isdigit() for ch in p)] == list("2734510008" + "6")
    for token, i in tok.hf.get_vocab().items():
        text = tok.token_bytes(i).decode("utf-8", errors="replace")
        if any("0" <= ch <= "9" for ch in text):
            assert len(text) == 1, f"token {token!r} mixes a digit with other characters"


def test_special_ids(tok):
    ids = [tok.pad_id, tok.im_start_id, tok.im_end_id, tok.vision_start_id, tok.vision_end_id, tok.image_pad_id,
           tok.think_id, tok.think_end_id, tok.tool_call_id, tok.tool_call_end_id]
    ids.append(tok.video_pad_id)
    assert len(set(ids)) == 11 and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.model_token_ids()["image_token_id"] == tok.image_pad_id == tok.encode("<|image_pad|>")[0]
    assert tok.encode("<think>\nA</think>") == [tok.think_id, *tok.encode("\nA"), tok.think_end_id]
    assert tok.eos_id == tok.im_end_id
    assert tok.vocab_size == T.DEFAULT_VOCAB_SIZE == 768
    assert tok.decode([tok.think_id, tok.im_end_id, tok.pad_id], skip_control=True) == "<think>"
    done = tok.encode("B") + [tok.im_end_id, tok.pad_id, tok.pad_id]
    assert tok.trim_completion(done) == tok.encode("B") and tok.trim_completion(tok.encode("B")) == tok.encode("B")
    with pytest.raises(ValueError, match="outside"):
        tok.decode([tok.vocab_size])


@pytest.mark.parametrize("method", ["spatialcore", "spatialthinker", "allospatial"])
def test_chat_template(tok, method):
    from spatial_jax.methods import get_method

    fmt = get_method(method).prompt
    s = synthetic.make_sample(synthetic.SyntheticConfig(), "heldout", 1, render_image=False)
    text = tok.apply_chat_template(prompts.build_messages(s, fmt), [13], enable_thinking=fmt.thinking)
    ids = tok.encode(text)
    assert ids.count(tok.image_pad_id) == 13
    v0 = ids.index(tok.vision_start_id)
    assert ids[v0 + 1 : v0 + 14] == [tok.image_pad_id] * 13 and ids[v0 + 14] == tok.vision_end_id
    assert text.startswith("<|im_start|>system\n" + fmt.system + "<|im_end|>\n<|im_start|>user\n")
    tail = "<|im_start|>assistant\n" + ("<think>\n" if method == "spatialcore" else "")
    assert "<|vision_end|>" + prompts.user_text(s, fmt) + "<|im_end|>\n" in text
    assert text.endswith(tail) and text.count("<|im_start|>") == 3
    if method == "spatialthinker":
        assert "Image size: (96 x 96)" in text
    with pytest.raises(ValueError, match="placeholder"):
        tok.apply_chat_template(prompts.build_messages(s, fmt), [4, 4])


def test_save_load_and_deterministic_vocab(tok, tmp_path):
    tok.save(tmp_path)
    loaded = T.SpatialTokenizer.load(tmp_path)
    s = "<|im_start|>user\n{\"bbox_2d\": [1, 2, 3, 4]}</think>\nB ünï"
    assert loaded.encode(s) == tok.encode(s) and loaded.vocab_size == tok.vocab_size
    assert loaded.think_end_id == tok.think_end_id and loaded.hf.chat_template == tok.hf.chat_template
    fresh = T.build_tokenizer.__wrapped__()
    assert fresh.hf.get_vocab() == tok.hf.get_vocab()
    assert np.array_equal(fresh.encode(s), tok.encode(s))


def test_video_pads_replace_the_template_block_and_bare_pads():
    """The chat template's `<|vision_start|><|video_pad|><|vision_end|>` becomes the frame blocks alone (no block
    around them); a bare `<|video_pad|>` (a prompt written without the template) is replaced as it stands."""
    frames = "<0.5 seconds>" + T.VISION_START + T.VIDEO_PAD * 2 + T.VISION_END
    block = T.VISION_START + T.VIDEO_PAD + T.VISION_END
    assert T.expand_video_pads(f"a{block}b", [frames]) == f"a{frames}b"
    assert T.expand_video_pads(f"a{T.VIDEO_PAD}b{block}", ["X", frames]) == f"aXb{frames}"
    assert T.expand_video_pads(f"{T.VISION_START}{T.VIDEO_PAD}b", [frames]) == f"{T.VISION_START}{frames}b"
    with pytest.raises(ValueError, match="1 video placeholder"):
        T.expand_video_pads(block, [frames, frames])
