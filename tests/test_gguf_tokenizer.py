"""Tests for the torch-free GGUF tokenizer (specjax.models.gguf_tokenizer): ids and decoded text
equal to transformers' own GGUF tokenizer on tiny vocabularies this test writes (every supported
pre-tokenizer, BOS/EOS flags, control and user-defined tokens, respelled tokens), one-line errors,
and the library and the runner importing and tokenizing with torch made unimportable.

The real SmolLM2 vocabulary is compared with transformers in test_gguf.py (SmolLM2Test).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from unittest import mock

from absl.testing import absltest, parameterized
import gguf

import specjax as sj
from specjax.models import gguf_tokenizer

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
  writer = gguf.GGUFWriter(file, "llama")
  writer.add_name(name)
  writer.add_tokenizer_model(model)
  writer.add_tokenizer_pre(pre)
  writer.add_token_list(tokens)
  writer.add_token_merges(MERGES)
  writer.add_token_types(types)
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_unk_token_id(0)
  writer.add_pad_token_id(2)
  if add_bos is not None:
    writer.add_add_bos_token(add_bos)
  if add_eos is not None:
    writer.add_add_eos_token(add_eos)
  writer.add_chat_template(CHAT_TEMPLATE)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return file


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
    import transformers

    file = self.file(pre=pre, add_bos=add_bos, add_eos=add_eos)
    reference = transformers.AutoTokenizer.from_pretrained(
        self.tmp, gguf_file=os.path.basename(file), local_files_only=True)
    chat = [{"role": "user", "content": "über <think>"}, {"role": "assistant", "content": "12"}]
    texts = {**TEXTS, "chat": reference.apply_chat_template(chat, tokenize=False,
                                                            add_generation_prompt=True)}
    built, cached = sj.load_tokenizer(file), sj.load_tokenizer(file)
    for tokenizer in (built, cached):
      for kind, text in texts.items():
        ids = tokenizer(text).input_ids
        self.assertEqual(ids, reference(text).input_ids, kind)
        self.assertEqual(tokenizer.decode(ids), reference.decode(ids), kind)
        self.assertEqual(tokenizer.decode(ids, skip_special_tokens=True),
                         reference.decode(ids, skip_special_tokens=True), kind)
        self.assertEqual(tokenizer(text, add_special_tokens=False).input_ids,
                         reference(text, add_special_tokens=False).input_ids, kind)
      self.assertEqual(tokenizer.apply_chat_template(chat, add_generation_prompt=True),
                       reference.apply_chat_template(chat, add_generation_prompt=True))
      for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "vocab_size"):
        self.assertEqual(getattr(tokenizer, attr), getattr(reference, attr), attr)
      self.assertEqual(len(tokenizer), len(reference))
      self.assertEqual(sorted(tokenizer.all_special_ids), sorted(reference.all_special_ids))

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


class ErrorTest(TokenizerTest):

  def test_unsupported_vocabulary_kind_names_the_model(self):
    file = self.file(model="llama", name="Tiny SPM")
    with self.assertRaisesRegex(ValueError, r"'Tiny SPM'.*tokenizer.ggml.model 'llama' is not "
                                r"supported yet \(supported: gpt2"):
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


class TorchFreeTest(TokenizerTest):
  """The library and the runner with torch unimportable (``sys.modules['torch'] = None``: also
  what ``importlib.util.find_spec`` then reports, so transformers sees no torch either)."""

  def test_import_and_tokenize_without_torch(self):
    file = self.file(add_bos=True)
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
        assert sys.modules["torch"] is None
        print("torch-free ok")
        """)
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", script], cwd=self.tmp, env=env,
                            capture_output=True, text=True, timeout=300)
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
                            capture_output=True, text=True, timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertRegex(result.stdout, r"ERROR: hf_\* methods need PyTorch.*specjax\[hf\]")


if __name__ == "__main__":
  absltest.main()
