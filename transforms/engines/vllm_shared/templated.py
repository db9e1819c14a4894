"""The prompt as an engine that holds the model's tokenizer builds it (base.py `prepare`): the local engine, the
machine engine's worker side and the simulated engine.

The hint is stripped of the tokenizer's control tokens, the messages go through the model's own chat template,
the prompt's text tokens are counted, and the page is decoded, capped for its detail and, when the prompt and
the answer leave too little room in max_model_len, shrunk to fit (or the page fails `over_token_budget`).
"""
from __future__ import annotations

from typing import Any

from PIL import Image

from schemas.reasons import OVER_TOKEN_BUDGET
from transforms.engines.base import PageRequest, PageSource, Prepared, RequestFailed, RequestRejected
from transforms.model import budget
from transforms.model.prompt import control_tokens, prompt_messages
from transforms.pages.render import decode_rgb
from transforms.pages.sizes import resize_for_detail


def page_pixels(data: bytes, detail_side: int, size: tuple[int, int] | None = None) -> Image.Image:
    """The page as the engine sees it: decoded, capped for its detail, and resized to `size` when the token
    budget shrank it. One function for both paths: `Templated.prepare` and the engine service."""
    img = resize_for_detail(decode_rgb(data), detail_side)
    return img if size is None or size == img.size else img.resize(size, Image.Resampling.LANCZOS)


def image_token_id_of(tok: Any) -> int | None:
    """The id of the token a prompt holds once per image token (what an engine counts image tokens by)."""
    for name in ("<|image_pad|>", "<image>", "<IMG_CONTEXT>"):  # Qwen2-VL, LLaVA(-NeXT), InternVL
        token_id = tok.convert_tokens_to_ids(name)
        if isinstance(token_id, int) and token_id != getattr(tok, "unk_token_id", None):
            return token_id
    return None


class Templated:
    """Prompts for one tokenizer; its control tokens are computed once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.controls = control_tokens(tokenizer)

    def prepare(self, request: PageRequest) -> Prepared:
        """vLLM's request ({"prompt", "multi_modal_data", "page": the fitted PageSource}); RequestFailed
        `over_token_budget` when not even a shrunk page fits; RequestRejected when the prompt cannot be built
        (an undecodable page: that page fails alone)."""
        try:
            return self._prepare(request)
        except RequestFailed:
            raise
        except Exception as err:  # this page's input (an undecodable image), not the engine
            raise RequestRejected(f"prompt could not be built: {type(err).__name__}: {err}") from err

    def _prepare(self, request: PageRequest) -> Prepared:
        parts, room = request.prompt, request.budget
        messages = prompt_messages(parts.text, parts.hint, self.controls)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template holds one image placeholder token, which the engine expands to image_tokens.
        text_tokens = len(self.tokenizer.encode(text, add_special_tokens=False)) - 1
        img = page_pixels(request.page.data, request.page.detail_side)
        size = budget.fit_image(img.width, img.height, text_tokens, room.max_tokens, room.max_model_len,
                                room.model_family)
        if size is None:
            raise RequestFailed(OVER_TOKEN_BUDGET, f"prompt needs {text_tokens} text tokens + {room.max_tokens} "
                                f"output tokens; max_model_len is {room.max_model_len}", text_tokens)
        if size != img.size:
            img = img.resize(size, Image.Resampling.LANCZOS)  # as page_pixels does with a size (no second decode)
        source = PageSource(request.page.data, request.page.detail_side, size)
        return Prepared({"prompt": text, "multi_modal_data": {"image": img}, "page": source}, text_tokens,
                        img.width, img.height)
