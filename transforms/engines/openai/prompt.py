"""The OpenAI engine's request (engine.py): the in-process prompt in the OpenAI form, with
the page as a JPEG data URL, and the hint cleaned of the model's control tokens.

The server holds the tokenizer and the chat template, and a server such as vLLM parses the special tokens of
the text it is sent: a `<image>` or `<end_of_utterance>` in a text layer would become the real token. So the
hint loses, besides the generic shapes (`<|...|>`, `[INST]`, ... of transforms/safety/injection.py), which
transforms.model.prompt.strip_controls removes for every engine:
- every special and added token of the model's own tokenizer, when `--model` is a local folder with one
  (transforms.model.prompt.control_tokens, the same rule as the in-process engine's);
- the known tokens of every family in FAMILY_TOKENS, always: a served model's `--model-family` only drives
  the token estimate and is easily left at its default, so the tables do not trust it.
"""
from __future__ import annotations

import base64
import functools
import io
import logging
from pathlib import Path

from transforms.engines.base import PageRequest, Prepared
from transforms.model import token_math
from transforms.model.prompt import control_tokens, prompt_messages
from transforms.pages.render import decode_rgb
from transforms.pages.sizes import low_detail_size, resize_for_detail

log = logging.getLogger(__name__)

# Control tokens of each family's released tokenizers that the generic shapes miss (those are `<|...|>`:
# Qwen2-VL's and Llama 3.2 Vision's own, InternLM2's, Llama 3's; and `[INST]`, `<tool_call>`, ...).
_IDEFICS3_TILES = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))  # up to its 6 x 6 tiles
FAMILY_TOKENS: dict[str, tuple[str, ...]] = {
    "qwen2_vl": (),
    "qwen2_5_vl": (),
    "llama-3.2-vision": (),
    "llava": ("<image>", "<s>", "</s>", "<unk>", "<pad>"),
    "llava_next": ("<image>", "<s>", "</s>", "<unk>", "<pad>"),
    "internvl2": ("<img>", "</img>", "<IMG_CONTEXT>", "<video>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>",
                  "</box>", "<s>", "</s>", "<unk>"),
    "idefics3": ("<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", *_IDEFICS3_TILES),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def family_tokens() -> tuple[str, ...]:
    """Every family's tokens of FAMILY_TOKENS, longest first (a longer token is removed before its prefix)."""
    found = {t for tokens in FAMILY_TOKENS.values() for t in tokens}
    return tuple(sorted(found, key=lambda t: (-len(t), t)))


@functools.lru_cache(maxsize=8)
def served_controls(model: str) -> tuple[str, ...]:
    """The tokens stripped from a served prompt's hint for `--model`: its tokenizer's special and added tokens
    when `model` is a local folder that holds a tokenizer, and every family's known tokens. Once per model:
    loading a tokenizer takes a second. Never runs code from the folder (no trust_remote_code)."""
    tokens = set(family_tokens())
    folder = Path(model).expanduser()
    if model and any((folder / name).is_file() for name in TOKENIZER_FILES):
        try:
            from transformers import AutoTokenizer

            tokens.update(control_tokens(AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)))
        except Exception as err:  # noqa: BLE001 - a tokenizer that needs its own code: the family tables remain
            log.warning("--model %s: tokenizer not loaded (%s: %s); stripping the known family tokens only",
                        folder, type(err).__name__, err)
    return tuple(sorted(tokens, key=lambda t: (-len(t), t)))


def page_image(image: bytes, width: int, height: int, detail_side: int) -> tuple[str, int, int]:
    """The page as sent: a JPEG data URL at the chosen detail, and its size. The page stage's JPEG goes as
    it is when no resize is needed (no second encode)."""
    size = low_detail_size(width, height, detail_side)
    if size != (width, height):
        img = resize_for_detail(decode_rgb(image), detail_side)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        image, size = buf.getvalue(), img.size
    return "data:image/jpeg;base64," + base64.b64encode(image).decode("ascii"), size[0], size[1]


def build_request(request: PageRequest) -> Prepared:
    """One page's request: the messages (transforms.model.prompt.prompt_messages, the image part as a data URL; the
    hint without the generic control-token shapes and without served_controls), the image tokens its usage is
    split by, and the schema's name for response_format. The image is sent at its detail; the server counts the
    prompt (text_tokens 0)."""
    page, parts = request.page, request.prompt
    width, height = _size(page.data)
    url, width, height = page_image(page.data, width, height, page.detail_side)
    image_tokens = token_math.estimate_image_tokens(request.budget.model_family, width, height)
    image = {"type": "image_url", "image_url": {"url": url}}
    messages = prompt_messages(parts.text, parts.hint, served_controls(request.model), image)
    return Prepared({"messages": messages, "image_tokens": image_tokens, "schema_id": parts.schema_id}, 0, width,
                    height)


def _size(data: bytes) -> tuple[int, int]:
    """The encoded page's size, read from its header (no decode)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.size
