"""Tokenizers built from GGUF metadata encode exactly as transformers' GGUF tokenizers do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models_reference import hf_tokenizer
from pie_core.models.tokenizer import Tokenizer
from pie_core.models.tokenizer_gguf import QWEN2_SPLIT, byte_to_unicode, recover_merges

CORPUS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "tabs\tand\t\tmore\ttabs\n\nnewlines\r\nCRLF\n\n\n\nend",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }',
    "\tclass A:\n\t\tpass\n\n\n\t\t\t# deep\n",
    "中文文本，包含标点。日本語のテキスト。한국어 텍스트.",
    "emoji 🤗🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "Ünïcödé àccents, ß, Æ, ø, ñ; Ελληνικά; русский текст",
    "numbers 1234567890 3.14159 1e-10 0xDEADBEEF",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad> literal specials <|endoftext|>",
    "   \n\t \u00a0 mixed whitespace \u2003 em space",
    "I'm you're they'll we've she'd IT'S",
    "https://example.com/path?query=1&x=y#frag",
    '<div class="a"><h3>Title</h3></div>',
    "SELECT * FROM users WHERE id = 42;",
    "a" * 300,
    " " * 40 + "x" + "\n" * 7,
    "\u200b zero width \ufeff bom",
    "",
    "<0x41> literal byte token text",
    "控制字符\x00\x01\x7f end",
]


@pytest.fixture(scope="module")
def ours(real_gguf: tuple[str, Path]) -> Tokenizer:
    return Tokenizer.from_gguf(real_gguf[1])


@pytest.mark.model
def test_encoding_matches_transformers_on_a_varied_corpus(real_gguf: tuple[str, Path], ours: Tokenizer) -> None:
    reference = hf_tokenizer(real_gguf[1])
    for text in CORPUS:
        expected = reference.encode(text, add_special_tokens=False)
        assert ours.encode(text) == expected, text
        assert ours.decode(expected) == reference.decode(expected), text
    assert ours.encode_batch(CORPUS[:3]) == [ours.encode(t) for t in CORPUS[:3]]


@pytest.mark.model
def test_token_bytes_concatenate_to_the_decoded_text(ours: Tokenizer) -> None:
    for text in CORPUS:
        ids = ours.encode(text)
        assert b"".join(ours.token_bytes(ids)).decode("utf-8") == ours.decode(ids), text


@pytest.mark.model
def test_token_bytes_split_multibyte_characters_across_tokens(ours: Tokenizer) -> None:
    ids = ours.encode("🤗")
    pieces = ours.token_bytes(ids)
    assert b"".join(pieces) == "🤗".encode()
    if len(ids) > 1:  # a character split over tokens: no single piece decodes on its own
        assert any(_invalid_utf8(p) for p in pieces)


def _invalid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.mark.model
def test_vocabulary_and_special_tokens(real_gguf: tuple[str, Path], ours: Tokenizer) -> None:
    arch = real_gguf[0]
    ids, pieces = ours.vocabs()
    assert ids == list(range(ours.vocab_size)) and len(pieces) == ours.vocab_size
    special_ids, special_text = ours.special_tokens()
    assert set(special_ids) == ours.special_ids and all(ours.is_special(i) for i in special_ids)
    if arch == "qwen2":
        assert ours.vocab_size == 151936 and ours.kind == "byte_level" and ours.split_regex() == QWEN2_SPLIT
        end = ours.token_to_id("<|im_end|>")
        assert end == 151645 and ours.eos_ids == (end,) and b"<|im_end|>" in special_text
        assert ours.token_bytes([ours.token_to_id("Ġworld")]) == [b" world"]
        assert ours.token_to_id("<tool_call>") is not None and not ours.is_special(ours.token_to_id("<tool_call>"))
    else:
        assert ours.vocab_size == 262144 and ours.kind == "sentencepiece" and ours.split_regex() == ""
        assert ours.bos_id == 2 and ours.eos_ids == (1,) and ours.is_special(ours.token_to_id("<end_of_turn>"))
        assert ours.token_bytes([ours.token_to_id("<0x0A>"), ours.token_to_id("▁the")]) == [b"\n", b" the"]


@pytest.mark.model
def test_save_and_load_round_trip(ours: Tokenizer, tmp_path: Path) -> None:
    ours.save(tmp_path / "tok.json")
    again = Tokenizer.load(tmp_path / "tok.json")
    for text in CORPUS:
        assert again.encode(text) == ours.encode(text)
    assert again.vocabs() == ours.vocabs() and again.special_ids == ours.special_ids
    assert (again.bos_id, again.eos_ids, again.split_regex()) == (ours.bos_id, ours.eos_ids, ours.split_regex())


@pytest.mark.model
def test_hf_folder_tokenizer_json(ours: Tokenizer, tmp_path: Path) -> None:
    ours.inner.save(str(tmp_path / "tokenizer.json"))
    eos = ours.id_to_token(ours.eos_ids[0])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos, "chat_template": "{{ x }}"}))
    folder = Tokenizer.from_hf_folder(tmp_path, vocab_size=ours.vocab_size)
    assert folder.kind == ours.kind and folder.split_regex() == ours.split_regex()
    assert folder.eos_ids == ours.eos_ids[:1] and folder.chat_template == "{{ x }}"
    for text in CORPUS:
        assert folder.encode(text) == ours.encode(text)
    assert folder.vocabs() == ours.vocabs()


def test_byte_alphabet_is_a_bijection_over_printable_characters() -> None:
    table = byte_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


def test_merges_recovered_best_first_longest_left_first() -> None:
    vocab = {"a": 0, "b": 1, "ab": 2, "abb": 3, "bb": 4}
    rank = {t: -i for t, i in vocab.items()}
    assert recover_merges(vocab, rank) == [("a", "b"), ("ab", "b"), ("a", "bb"), ("b", "b")]


def _sentencepiece_gguf(path: Path) -> None:
    import gguf
    import numpy as np

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    words = ["▁", "a", "b", "c", "▁a", "ab", "▁ab", "▁abc", "bc", "▁b", "é", "▁é"]
    tokens = pieces + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    scores = [0.0] * len(pieces) + [-float(i) for i in range(len(words))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(True)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_llama_sentencepiece_gguf_matches_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "spm.gguf"
    _sentencepiece_gguf(path)
    ours = Tokenizer.from_gguf(path)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ours.kind == "sentencepiece" and ours.bos_id == 1 and ours.eos_ids == (2,)
    for text in ["abc ab", "a b c", " ab", "é ab é", "xyz 🤗", "ab</s>a", ""]:
        ids = ours.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False), text
        if ids:  # the raw bytes keep the prefix space that decoding strips
            assert b"".join(ours.token_bytes(ids)).decode("utf-8") == " " + ours.decode(ids), text
    assert ours.token_bytes([ours.token_to_id("<0x41>"), ours.token_to_id("▁ab")]) == [b"A", b" ab"]
