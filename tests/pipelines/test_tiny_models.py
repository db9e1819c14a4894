"""The tiny random models of pipelines/tiny_models/ (Qwen2-VL, the default, used by the engine tests, and the
other families from the command line)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from pipelines.tiny_models import make_test_model


def _hashes(folder: Path) -> dict[str, str]:
    files = sorted(f for f in folder.iterdir() if f.is_file())
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def model_dir(test_model_dir: Path) -> Path:
    return test_model_dir  # the session's model: make_test_model(folder), as every engine test uses it


def test_folder_layout(model_dir: Path) -> None:
    names = {f.name for f in model_dir.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
    } <= names
    size = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file())
    assert 500_000 < size < 5_000_000, size  # "a few MB": cheap to build in every CI run


def test_config_and_processor(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl"
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    vision = config["vision_config"]
    assert (vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"]) == (14, 2, 2)
    # Long enough for max_model_len 8192 with a full-size page.
    assert config["text_config"]["max_position_embeddings"] >= 8192

    pre = json.loads((model_dir / "preprocessor_config.json").read_text())
    # The real Qwen2-VL settings, so image-token counts match the production model.
    assert (pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]) == (14, 2, 2)
    assert (pre["min_pixels"], pre["max_pixels"]) == (3136, 12845056)
    assert pre["size"] == {"shortest_edge": 3136, "longest_edge": 12845056}


def test_tokenizer_and_chat_template(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = tok.get_vocab()
    config = json.loads((model_dir / "config.json").read_text())
    assert vocab["<|image_pad|>"] == config["image_token_id"]
    assert vocab["<|vision_start|>"] == config["vision_start_token_id"]
    assert tok.eos_token == "<|im_end|>"
    # Special tokens stay single tokens, and arbitrary bytes round-trip (byte-level BPE).
    assert tok.encode("<|vision_start|><|image_pad|><|vision_end|>", add_special_tokens=False) == [
        vocab["<|vision_start|>"],
        vocab["<|image_pad|>"],
        vocab["<|vision_end|>"],
    ]
    text = '{"total": 12.50, "name": "Müller \\u00e9"}\x00'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Extract."}]}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Extract.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_deterministic(model_dir: Path, tmp_path: Path) -> None:
    again = make_test_model(tmp_path / "again")
    assert _hashes(again) == _hashes(model_dir)
    other = make_test_model(tmp_path / "other", seed=1)
    assert _hashes(other)["model.safetensors"] != _hashes(model_dir)["model.safetensors"]


def test_leaves_global_rng_alone(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_test_model(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_next", "internvl", "idefics3"])
def test_other_families_from_the_command_line(family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines import cli
    from transforms.model.token_math import DEFAULT_RULES, rule_for

    assert cli.main(["make-test-model", str(tmp_path / family), "--family", family]) == 0
    folder = Path(json.loads(capsys.readouterr().out)["model"])
    assert json.loads((folder / "config.json").read_text())["model_type"] == family
    # The real processor settings of the family's released checkpoints: the same image-token rule.
    assert dataclasses.replace(rule_for("qwen2_vl", str(folder)), source="") == \
        dataclasses.replace(DEFAULT_RULES[{"internvl": "internvl2"}.get(family, family)], source="")
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    assert size < 5_000_000, size


def test_unknown_family_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown family 'pixtral'"):
        make_test_model(tmp_path / "x", family="pixtral")
