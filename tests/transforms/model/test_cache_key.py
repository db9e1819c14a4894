"""The cache configuration key is derived from the settings dataclasses (transforms/model/cache_key.py): every
field of each keyed class is either in the key (changing it changes the key) or named in EXCLUDE (changing
it does not). A field added to one of these classes fails here until it is one or the other."""
from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest

from schemas.extraction import ExtractionSchema, load_schema
from tests.support.extract_configs import extract_config
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.extract.stage import ExtractConfig
from transforms.hints.choose import HintSettings
from transforms.hints.ocr import OcrSettings
from transforms.model.cache_key import EXCLUDE, canonical, settings_key
from transforms.model.markdown import Field, MarkdownFormat, load_output
from transforms.model.prompt import DecodingParams, config_key
from transforms.model.token_math import ImageTokenRule, rule_for
from transforms.pages.render import RenderSettings
from transforms.safety.gate import SafetyConfig

MARKDOWN = load_output("olmocr")[1]
# One instance of each keyed class, with values where a change can be seen (a classifier, so that its
# threshold counts; non-empty tuples, so that one can be shortened).
BASES: dict[type, Any] = {
    RenderSettings: RenderSettings(dpi=150, max_side=1288, jpeg_quality=90, max_text_chars=20000,
                                   max_page_points=14400, max_image_pixels=89_478_485, max_bytes=2**26),
    SafetyConfig: SafetyConfig(blocklists=("a.txt",), pdq_threshold=31, nsfw_classifier="nudenet",
                               nsfw_threshold=0.8, checks=("a:b", "c:d"), low_detail_side=640),
    HintSettings: HintSettings(),
    OcrSettings: OcrSettings(),
    DecodingParams: DecodingParams(384),
    ExtractConfig: extract_config(model_family=rule_for("llava_next"), prices={"providers": {}}, max_in_flight=4,
                                  route="model", markdown=MARKDOWN),
    VllmLocalSettings: VllmLocalSettings(model="m", model_revision="r", max_model_len=8192, max_num_seqs=16,
                                         gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                                         kv_cache_gib=2.0, enforce_eager=True, in_process=True),
    ExtractionSchema: load_schema("invoice"),
    ImageTokenRule: rule_for("llava_next"),
    MarkdownFormat: MARKDOWN,
    Field: Field(name="is_table", kind="int", values=(0, 1)),
}


def key_name(cls: type) -> str:
    """The name a class is keyed (and excluded) under: its `key_name`, else its own (cache_key.py)."""
    return getattr(cls, "key_name", cls.__name__)


def key_of(obj: Any) -> str:
    return config_key(obj) if isinstance(obj, ExtractConfig) else settings_key(obj)


def changed(value: Any) -> Any:
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return "x"
    if isinstance(value, tuple):
        assert value, "give the base a non-empty tuple"
        return value[:-1]
    if isinstance(value, dict):
        return {**value, "x": 1}
    if dataclasses.is_dataclass(value):
        name = next(f.name for f in dataclasses.fields(value) if f.name not in EXCLUDE.get(key_name(type(value)), {}))
        return replace(value, **{name: changed(getattr(value, name))})
    raise AssertionError(f"no change for {value!r}")


@pytest.mark.parametrize("cls", list(BASES), ids=lambda c: c.__name__)
def test_every_field_is_keyed_or_excluded(cls: type) -> None:
    base = BASES[cls]
    key = key_of(base)
    assert key == key_of(replace(base))  # a copy: the same key
    excluded = EXCLUDE.get(key_name(cls), {})
    for f in dataclasses.fields(cls):
        other = replace(base, **{f.name: changed(getattr(base, f.name))})
        if f.name in excluded:
            assert key_of(other) == key, f"{cls.__name__}.{f.name} is excluded but changes the key"
        else:
            assert key_of(other) != key, (f"{cls.__name__}.{f.name} does not change the key: key it, or add it "
                                          "to EXCLUDE in transforms/model/cache_key.py with the reason")


def test_the_exclude_set_names_real_fields_with_reasons() -> None:
    by_name = {key_name(c): c for c in BASES}
    for name, fields in EXCLUDE.items():
        assert name in by_name, f"EXCLUDE names {name}, which is not a keyed class"
        real = {f.name for f in dataclasses.fields(by_name[name])}
        assert set(fields) <= real, f"EXCLUDE names fields {set(fields) - real} that {name} lacks"
        assert all(why.strip() for why in fields.values())


def test_safety_key_form_makes_order_and_an_unused_threshold_irrelevant() -> None:
    assert settings_key(SafetyConfig(checks=("b:c", "a:b"))) == settings_key(SafetyConfig(checks=("a:b", "b:c")))
    assert settings_key(SafetyConfig(nsfw_threshold=0.1)) == settings_key(SafetyConfig(nsfw_threshold=0.9))
    with_classifier = SafetyConfig(nsfw_classifier="nudenet")
    assert settings_key(with_classifier) != settings_key(replace(with_classifier, nsfw_threshold=0.1))


def test_the_canonical_form_is_pinned() -> None:
    """A silent change of the serialisation re-extracts every cached page: it is pinned here, and changed
    only on purpose (docs/extraction.md says the first run after such a change re-extracts)."""
    assert canonical(OcrSettings(lang="deu", timeout_s=5.0), "t", (1, 2.5), None) == \
        '[{"OcrSettings":{"lang":"deu","psm":3}},"t",[1,2.5],null]'
    # The key is the plain sha256 of that form: sha256('[{"OcrSettings":{"lang":"deu","psm":3}}]'), derived once
    # with hashlib by hand (a salted or otherwise changed hash fails here).
    assert settings_key(OcrSettings(lang="deu", timeout_s=5.0)) == \
        "8ccff2006f95c52273024f956cd70f924182f5be6f3f722358a1c0a4fc3a6e6a"


def test_the_vllm_settings_are_keyed_under_their_former_name() -> None:
    """VllmLocalSettings was EngineSettings when earlier runs wrote their keys: keyed under another name, every
    cached page would be extracted again. The form below is the old class's, written out by hand (its keyed fields
    model, model_revision and max_model_len; the rest excluded)."""
    assert canonical(BASES[VllmLocalSettings]) == \
        '[{"EngineSettings":{"max_model_len":8192,"model":"m","model_revision":"r"}}]'


def test_a_setting_without_a_canonical_form_is_refused() -> None:
    with pytest.raises(TypeError, match="set"):
        settings_key({1, 2})


def test_an_opt_in_setting_is_keyed_only_when_set() -> None:
    # Keys written before --evidence-quotes existed stay valid while it is off; turning it on re-extracts.
    cfg = extract_config(schema=load_schema("invoice"))
    off = config_key(cfg)
    assert "evidence_quotes" not in canonical(cfg)
    assert config_key(replace(cfg, evidence_quotes=True)) != off
    assert config_key(replace(cfg, evidence_quotes=False)) == off
