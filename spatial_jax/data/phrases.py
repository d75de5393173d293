"""Object phrases of a question and its options, for the pseudo-GT detector (SpatialCORE A.3): offline
(`extract_phrases`: runs of content words, relational and non-visual words removed) or from an OpenAI-compatible chat
endpoint (`ChatExtractor`), every extractor's output cleaned alike (`clean_phrases`)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Sequence

from spatial_jax.records import brief

PhraseExtractor = Callable[[str, Sequence[str]], Sequence[str]]

# Relational, directional, metric and otherwise non-visual words (A.3: "left, right, front, distance, direction"
# and their kin): they name no object, so they end a phrase and never start one.
RELATIONAL = frozenset("""
left right front behind back rear ahead before after beside besides between among amid next adjacent near nearer
nearest close closer closest far farther farthest further furthest above below under underneath beneath over top
bottom up down upper lower high higher highest low lowest inside outside within into onto toward towards away
across along around through past beyond opposite against relative relation relationship compared position
positions located location locations placed positioned situated side sides center centre centers centres middle
edge edges corner corners direction directions distance distances orientation angle angles north south east west
northeast northwest southeast southwest northern southern eastern western clockwise counterclockwise anticlockwise
leftmost rightmost topmost bottommost uppermost lowermost frontmost backmost foreground background horizontal
vertical diagonal perspective viewpoint view views camera viewer observer facing faces face heading height width
length depth size sizes large larger largest small smaller smallest big bigger biggest tall taller tallest short
shorter shortest long longer longest wide wider widest narrow deep shallow meter meters metre metres centimeter
centimeters cm mm km feet foot inch inches pixel pixels px degree degrees percent unit units
""".split())

# Function words, question words, common verbs and generic nouns: phrase breaks too.
STOPWORDS = frozenset("""
a an the this that these those there here it its it's they them their theirs he him his she her hers we us our
you your yours i me my mine one ones what which who whom whose where when why how whether if then than as so
such and or nor but not no yes both either neither each every all any some many much more most less least few
several other another same different only just also very too quite about approximately roughly exactly is are was
were be been being am do does did done has have had having can could would should will shall may might must to
of in on at by for with from via per see seen look looks looked find show shows shown appear appears appeared
visible need needs want get gets make makes take takes put go goes went turn turns move moves moved walk walks
stand stands sit sits lie lies say tell know think reach reaches pass passes cross enter exit leave come comes
happen happens answer answers option options question questions choice choices image images picture pictures
photo photos photograph scene scenes frame frames object objects thing things item items entity entities number
numbers count total amount color colour colors colours shape shapes type types kind kinds part parts way ways
time times place places area areas region regions first second third fourth last many following given based
according respect regard order whose
""".split())

COLORS = frozenset("""
red orange yellow green blue purple violet pink brown black white gray grey silver gold golden beige cyan magenta
navy maroon teal turquoise tan khaki olive
""".split())

# Words ending in -ing or -ly are mostly verbs and adverbs in questions; these are objects.
_ING_NOUNS = frozenset("""
building buildings ceiling painting paintings clothing railing railings drawing drawings awning ring rings wing
wings string swing swings spring sling bedding pudding icing king sibling siblings stocking stockings earring
earrings
""".split())
_LY_NOUNS = frozenset("fly family belly jelly lily bully trolley assembly".split())
# A link word joins two object chunks: "of" always ("cup of coffee"), the others only before a colour, so
# "boy in orange clothes" stays one phrase while "man in the car" gives two.
_LINKS = {"of": False, "in": True, "with": True, "wearing": True}
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:['’-][A-Za-z0-9]+)*|\S")
_SPACE = re.compile(r"\s+")


def _is_content(word: str) -> bool:
    if len(word) < 2 or word in STOPWORDS or word in RELATIONAL or "'" in word or "’" in word:
        return False
    if word.endswith("ing") and word not in _ING_NOUNS:
        return False
    return not (word.endswith("ly") and len(word) > 4 and word not in _LY_NOUNS)


def _chunks(text: str) -> list[str]:
    """Runs of content words in `text`, linked as _LINKS says; anything else ends a run."""
    out: list[list[str]] = []
    run: list[str] = []
    link: str | None = None  # a link word seen right after a run, waiting for the next run to decide
    for tok in _TOKEN.findall(text):
        word = tok.lower()
        possessive = len(word) > 2 and word.endswith(("'s", "’s"))
        word = word[:-2] if possessive else word
        if _is_content(word):
            if not run and link is not None and out and (not _LINKS[link] or word in COLORS):
                run = out.pop() + [link]
            run.append(word)
            link = None
        elif word in _LINKS and run:
            out.append(run)
            run, link = [], word
        elif word in ("a", "an", "the") and link is not None and not run:
            continue  # "boy in an orange shirt": articles after a link keep it waiting
        else:
            if run:
                out.append(run)
            run, link = [], None
        if possessive and run:  # "the man's hat": the owner and the owned are two objects
            out.append(run)
            run, link = [], None
    if run:
        out.append(run)
    return [" ".join(r) for r in out]


def clean_phrases(phrases: Sequence[str]) -> list[str]:
    """Lower-cased, whitespace collapsed, duplicates and phrases without an object word dropped, order kept. Applied
    to every extractor's output, so a remote extractor's "the left side" never reaches the detector."""
    out: list[str] = []
    for p in phrases:
        text = _SPACE.sub(" ", str(p).lower()).strip(" .,;:!?\"'")
        words = [w.lower() for w in _TOKEN.findall(text)]
        if text and any(_is_content(w) for w in words) and text not in out:
            out.append(text)
    return out


def extract_phrases(question: str, options: Sequence[str] = ()) -> list[str]:
    """Object phrases of a question and its options, offline: runs of content words (colours and other modifiers
    kept), relational, directional and non-visual words removed (A.3)."""
    found = _chunks(question)
    for option in options:
        found.extend(_chunks(option))
    return clean_phrases(found)


class ExtractorError(RuntimeError):
    """A phrase-extraction endpoint that cannot be reached or answers with something other than a phrase list."""


EXTRACTOR_PROMPT = (
    "List the physical objects and persons mentioned in the question and answer options below, as a JSON array of "
    "short noun phrases. Keep modifiers that tell instances apart (for example \"boy in orange clothes\", \"gray "
    "vehicle\"). Leave out relational or directional words (left, right, front, behind, distance, direction, "
    "closer, farther) and anything that is not a visible object. Reply with the JSON array only."
)


class ChatExtractor:
    """Phrases from an OpenAI-compatible chat-completions endpoint (SpatialCORE used GPT-4o-mini; a local vLLM
    server works too). Built only when the user asks for it (`--extractor-url`); `url` is the API base, such as
    `https://api.openai.com/v1`. The reply must hold a JSON array of strings; it goes through `clean_phrases`.
    `post(url, body, headers) -> parsed JSON reply` replaces the HTTP call (tests never touch the network)."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 60.0,
                 post: Callable[[str, dict, dict], dict] | None = None):
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout = model, api_key, timeout
        self.post = post or self._http_post

    def _http_post(self, url: str, body: dict, headers: dict) -> dict:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except (OSError, ValueError) as e:  # URLError, HTTPError and timeouts are OSErrors
            raise ExtractorError(f"phrase extractor {url}: {e}") from None

    def __call__(self, question: str, options: Sequence[str] = ()) -> list[str]:
        lines = [f"Question: {question}"] + [f"Option: {o}" for o in options]
        body = {
            "model": self.model,
            "temperature": 0,
            "messages": [{"role": "system", "content": EXTRACTOR_PROMPT},
                         {"role": "user", "content": "\n".join(lines)}],
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        reply = self.post(self.endpoint, body, headers)
        try:
            content = reply["choices"][0]["message"]["content"]
            phrases = json.loads(content[content.index("["): content.rindex("]") + 1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise ExtractorError(f"phrase extractor {self.endpoint}: no JSON array of phrases in its reply "
                                 f"{brief(reply)}") from None
        if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
            raise ExtractorError(f"phrase extractor {self.endpoint}: expected a JSON array of strings, got "
                                 f"{brief(phrases)}")
        return clean_phrases(phrases)
