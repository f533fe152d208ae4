"""Model names → sources: built-ins, config entries, paths; list and info for the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, decoders, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from pie_core import config
from pie_core.errors import NotFound
from pie_core.models.chat_formats import ChatMLFormat
from pie_core.models.registry import list_models, model_info, resolve_model
from pie_core.models.tokenizer_gguf import byte_to_unicode

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIE_HOME", str(tmp_path / "home"))


@pytest.fixture()
def tiny_folder(tiny_hf: dict[str, Path], tmp_path: Path) -> Path:
    """The tiny qwen2 checkpoint plus a byte-level tokenizer.json of 128 tokens."""
    folder = tmp_path / "tiny-qwen"
    folder.mkdir()
    for f in tiny_hf["qwen2"].iterdir():
        (folder / f.name).symlink_to(f)
    chars = list(byte_to_unicode().values())[:126]
    tok = HFTokenizer(BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML}))
    return folder


def test_unknown_name_lists_the_models_that_exist() -> None:
    config.set("model.mine.path", "/nowhere.gguf")
    with pytest.raises(NotFound) as err:
        resolve_model("no-such-model")
    message = str(err.value)
    assert "no-such-model" in message and "qwen2.5-coder-0.5b-instruct" in message and "mine" in message


def test_config_entry_for_a_hugging_face_folder(tiny_folder: Path) -> None:
    config.set("model.tiny.path", str(tiny_folder))
    source = resolve_model("tiny")
    assert source.name == "tiny" and source.format == "hf" and source.spec.arch == "qwen2"
    assert source.tokenizer.vocab_size == 128 and source.tokenizer.kind == "byte_level"
    assert isinstance(source.chat, ChatMLFormat) and source.chat.stop_tokens == (127,)
    weights = dict(source.weights())
    assert "token_embd.weight" in weights and weights["token_embd.weight"].dtype == np.float32
    assert source.quant_types == {"F32": len(weights)}
    assert resolve_model(str(tiny_folder)).spec == source.spec  # a path works as a name too


def test_list_models_shows_builtins_and_entries(tiny_folder: Path) -> None:
    config.set("model.tiny.path", str(tiny_folder))
    config.set("model.broken.path", "/does/not/exist.gguf")
    rows = {r.name: r for r in list_models()}
    default = rows["qwen2.5-coder-0.5b-instruct"]
    assert default.default and default.builtin and default.available and default.arch == "qwen2"
    assert rows["tiny"].available and rows["tiny"].arch == "qwen2" and rows["tiny"].format == "hf"
    assert not rows["broken"].available and "does not exist" in rows["broken"].note
    assert "gemma3-270m" in rows


@pytest.mark.model
def test_default_model_resolves_and_its_weights_come_back_from_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, qwen_gguf: Path
) -> None:
    monkeypatch.setenv("PIE_CACHE_DIR", str(tmp_path / "cache"))
    config.set("model.q.path", str(qwen_gguf))  # the assembled file, without re-assembling it
    source = resolve_model("q")
    assert source.spec.arch == "qwen2" and isinstance(source.chat, ChatMLFormat)
    progress: list[tuple[int, int]] = []
    cold = {n: a[:2].copy() for n, a in source.weights(progress=lambda d, t: progress.append((d, t)))}
    assert len(cold) == 291 and progress[-1][0] == progress[-1][1]
    warm = {n: a for n, a in source.weights()}
    assert all(isinstance(a, np.memmap) for a in warm.values())
    for name, head in cold.items():
        np.testing.assert_array_equal(warm[name][:2], head)


@pytest.mark.model
def test_model_info_describes_the_default_model() -> None:
    info = model_info()
    assert info["name"] == "qwen2.5-coder-0.5b-instruct" and info["format"] == "gguf"
    assert info["spec"]["num_layers"] == 24 and info["tokenizer"]["vocab_size"] == 151936
    assert info["chat_format"]["name"] == "chatml" and info["quant_types"]["Q5_0"] > 0
    assert info["file_size"] == 491_400_064
    json.dumps(info)
