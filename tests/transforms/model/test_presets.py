"""pipelines/config/presets.py: the registry, `pagemill presets`, and flags overriding a preset."""
from __future__ import annotations

import dataclasses

import pytest

from pipelines import cli
from pipelines.config.options import PagemillOptions
from pipelines.config.presets import PRESETS, get_preset, with_preset


def options(flags: list[str]) -> PagemillOptions:
    return PagemillOptions(flags).view_as(PagemillOptions)


def test_default_preset_is_exactly_todays_defaults() -> None:
    default = options([])
    for key, value in PRESETS["qwen2.5-vl"].options().items():
        assert getattr(default, key) == value, key


def test_preset_sets_options_and_explicit_flags_win() -> None:
    o = options(with_preset(["--preset", "olmocr"]))
    assert (o.model, o.schema, o.model_family, o.hints, o.max_tokens) == (
        "allenai/olmOCR-2-7B-1025", "olmocr", "qwen2_5_vl", "none", 8000)
    o = options(with_preset(["--max-tokens", "64", "--preset=olmocr", "--model", "/models/tiny"]))
    assert (o.model, o.max_tokens, o.schema) == ("/models/tiny", 64, "olmocr")
    assert with_preset(["--max-tokens", "64"]) == ["--max-tokens", "64"]
    # Every preset's template takes the shared text first; a flag still picks the old order.
    assert {p.prompt_layout for p in PRESETS.values()} == {"shared_first"}
    assert options(with_preset(["--preset", "llava-next", "--prompt-layout", "image_first"])).prompt_layout == \
        "image_first"
    with pytest.raises(ValueError, match=r"unknown preset 'nope'; known: qwen2\.5-vl, olmocr, llava-next"):
        with_preset(["--preset", "nope"])


def test_presets_are_frozen_and_read_only() -> None:
    preset = get_preset("llava-next")
    assert (preset.output_kind, preset.parser, preset.model_family) == ("markdown", "markdown", "llava_next")
    assert (PRESETS["olmocr"].prompt, PRESETS["olmocr"].parser) == ("olmocr_v4_yaml", "front_matter+markdown")
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset.model = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        PRESETS["x"] = preset  # type: ignore[index]


def test_presets_command_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    # The whole listing: three lines a preset, in the registry's order, every field of each preset.
    expected = []
    for p in PRESETS.values():
        expected += [f"{p.name:<12} {p.description}",
                     f"{'':<12} model {p.model}; output {p.output_kind} (--schema {p.schema}); prompt {p.prompt} "
                     f"({p.prompt_layout}); "
                     f"parser {p.parser}; image tokens {p.model_family}; pages at --max-side {p.max_side}, "
                     f"--detail {p.detail}; --max-tokens {p.max_tokens}",
                     f"{'':<12} extracts: {p.extracts}"]
    assert out.splitlines() == expected
    assert [line.split()[0] for line in out.splitlines()[::3]] == ["qwen2.5-vl", "olmocr", "llava-next"]


def test_run_refuses_an_unknown_preset(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code = cli.main(["run", "--input", str(tmp_path), "--output", str(tmp_path / "out"), "--preset", "gpt-9"])
    assert code == 2
    assert "unknown preset 'gpt-9'" in capsys.readouterr().err


def test_write_markdown_needs_markdown_output(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code = cli.main(["run", "--input", str(tmp_path), "--output", str(tmp_path / "out"), "--write-markdown"])
    assert code == 2
    assert "--write-markdown needs markdown output" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_job_file_can_name_a_preset_and_override_it(tmp_path) -> None:
    from pipelines.config.options import merge_flags

    job = tmp_path / "jobs" / "olmocr.yaml"
    job.parent.mkdir()
    job.write_text("preset: olmocr\nmax_tokens: 2000\n")
    o = options(with_preset(merge_flags(["--hints", "auto"], str(job))))
    assert (o.preset, o.schema, o.max_tokens, o.hints, o.detail) == ("olmocr", "olmocr", 2000, "auto", "high")
