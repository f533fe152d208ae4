"""Reference sections "Model" and "Tokenizer", call by call, through the SDK on the dummy engine
(the default model's real tokenizer, no weights)."""

from __future__ import annotations

import pytest
import regex

from inferlet import Model, Tokenizer, runtime
from pie_core.errors import NotFound

TEXT = "Pie serves LLMs — fast! 中文, emoji 🤗, numbers 12345 and   spaces.\nNew line."


def _in_inferlet(dummy, check):
    async def main(_):
        return check(Model.load(runtime.models()[0]))

    return dummy.value(main)


def test_model_load_binds_a_loaded_model_and_refuses_others(dummy):
    async def main(_):
        model = Model.load(runtime.models()[0])
        with pytest.raises(NotFound, match="loaded models"):
            Model.load("no-such-model")
        return model.name, isinstance(model.tokenizer(), Tokenizer), model.vocab_size

    name, has_tokenizer, vocab = dummy.value(main)
    assert name == dummy.model and has_tokenizer
    assert vocab == dummy.engine.models[dummy.model].spec.vocab_size


def test_encode_and_decode_round_trip(dummy):
    def check(model: Model):
        tk = model.tokenizer()
        ids = tk.encode(TEXT)
        return ids, tk.decode(ids), tk.encode("<|im_end|>")

    ids, text, special = _in_inferlet(dummy, check)
    assert all(isinstance(i, int) for i in ids) and 10 < len(ids) < len(TEXT)
    assert text == TEXT
    assert len(special) == 1  # special tokens written in the text are recognised


def test_vocabs_are_parallel_lists_whose_bytes_spell_the_text(dummy):
    def check(model: Model):
        tk = model.tokenizer()
        ids, pieces = tk.vocabs()
        by_id = dict(zip(ids, pieces))
        spelled = b"".join(by_id[i] for i in tk.encode(TEXT))
        return len(ids), len(pieces), len(set(ids)), spelled == TEXT.encode(), model.vocab_size, type(pieces[0]).__name__

    n_ids, n_pieces, distinct, spells, vocab, piece_type = _in_inferlet(dummy, check)
    assert n_ids == n_pieces == distinct and 0 < n_ids <= vocab
    assert spells and piece_type == "bytes"


def test_special_tokens_list_the_control_tokens(dummy):
    def check(model: Model):
        tk = model.tokenizer()
        ids, pieces = tk.special_tokens()
        return ids, [p.decode() for p in pieces], tk.encode("<|im_end|>")[0], tk.encode("<|endoftext|>")[0]

    ids, pieces, im_end, eos = _in_inferlet(dummy, check)
    assert len(ids) == len(pieces)
    assert dict(zip(ids, pieces))[im_end] == "<|im_end|>" and dict(zip(ids, pieces))[eos] == "<|endoftext|>"


def test_split_regex_is_the_pre_tokenisation_split(dummy):
    def check(model: Model):
        tk = model.tokenizer()
        pattern = tk.split_regex()
        pieces = regex.findall(pattern, TEXT)
        return pattern, pieces, tk.encode(TEXT), [t for p in pieces for t in tk.encode(p)]

    pattern, pieces, whole, piecewise = _in_inferlet(dummy, check)
    assert isinstance(pattern, str) and "".join(pieces) == TEXT
    assert whole == piecewise  # BPE never merges across the pieces the regex makes
