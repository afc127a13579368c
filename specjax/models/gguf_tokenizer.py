"""A GGUF file's tokenizer, built from its metadata with the ``tokenizers`` library (no torch).

A GGUF holds no ``tokenizer.json``: llama.cpp stores the vocabulary, merges or scores, token types
and special ids as metadata (``tokenizer.ggml.*``). We read them (``read_tokenizer_metadata``,
from the file's bytes with ``gguf.read_header``) and build the fast tokenizer they describe with
``tokenizers``, wrapped as a ``transformers.PreTrainedTokenizerFast`` so that
``apply_chat_template``, ``decode`` and special tokens behave as users expect. transformers can
build the same tokenizer (``AutoTokenizer`` with ``gguf_file=``), but its GGUF path imports torch,
which the library and the runner do not need; the tests require our ids and decoded text to equal
transformers' where torch is installed.

Supported vocabulary kinds (``tokenizer.ggml.model``, ``SUPPORTED_MODELS``):

- ``gpt2``: byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2, ...). The text is split before the
  merges by the regex that ``tokenizer.ggml.pre`` names (``PRE_TOKENIZERS``); an unknown ``pre``
  value is refused rather than silently split the GPT-2 way.
- ``llama``: SentencePiece BPE (Llama 1/2, Mistral v0.1, Gemma 1-3, ...), as BPE with byte
  fallback (``<0xNN>`` tokens) and "▁" for the space. A file without merges (the usual case) gets
  them rebuilt from the vocabulary: every split of a token into two tokens is a merge, ranked by
  the token's score (Gemma: by its position in the file, which its scores do not follow). Gemma
  (``general.architecture`` in ``GEMMA_ARCHITECTURES``) replaces spaces with "▁" and prepends
  nothing; the others prepend "▁" to the text's first piece (``Metaspace``, as transformers does
  whatever ``add_space_prefix`` says). Without ``add_bos_token`` a BOS is added (llama.cpp's
  default for SentencePiece).

The other kinds (``t5``, ``rwkv``, ...) are refused with the model's name in the error.

Where we differ from transformers on purpose (no ids of a real file change): a SentencePiece file
whose vocabulary lacks "<s>"/"</s>" gets no such extra tokens (transformers adds both past the
vocabulary, from ``LlamaTokenizer``'s defaults), and its unknown token is the file's
(``unknown_token_id``; transformers sets none for Llama, "<unk>" for Gemma), used only where no
byte token covers a character.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

from specjax.cache import atomic_path, file_sha256
from specjax.models import checkpoints
from specjax.models.gguf import _cache_files, read_header  # one cache key and reader

# llama.cpp's token types (gguf.TokenType): CONTROL tokens are special; USER_DEFINED ones are
# matched whole in the text but are not special.
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer splits: ``tokenizer.ggml.pre`` -> the regex that cuts the text before byte-level
# BPE (llama.cpp's ``llama-vocab.cpp``; the names transformers' GGUF loader maps to the same
# regexes); ``None`` = GPT-2's own split (ByteLevel's built-in regex). ``smollm``: llama.cpp splits
# digits one by one first; SmolLM2's vocabulary has no multi-digit token, so that changes no ASCII
# text's ids, and we follow transformers, which does not (the two differ on non-ASCII numerals
# that the vocabulary merges, such as " ½").
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, str | None] = {
    **dict.fromkeys(("default", "gpt2", "smollm"), None),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2),
}
SUPPORTED_MODELS = ("gpt2", "llama")
# SentencePiece vocabularies spelled the Gemma way (transformers' ``gemma_tokenizer``, picked by
# architecture as there: nothing else in the file tells): spaces become "▁" by a normalizer, no
# "▁" is prepended, and merges are ranked by the tokens' order in the file.
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
_SPACE = "\u2581"  # SentencePiece's spelling of the space


@functools.lru_cache(maxsize=1)
def _byte_to_char() -> dict[int, str]:
  """GPT-2's reversible byte -> printable character table (Radford et al. 2019, ``encoder.py``):
  printable Latin-1 bytes stand for themselves, the other 68 are shifted past U+0100."""
  kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
  shifted = [b for b in range(256) if b not in kept]
  return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def read_tokenizer_metadata(path: str | os.PathLike) -> dict[str, Any]:
  """The ``tokenizer.ggml.*`` metadata of a GGUF file (and its chat template) as a plain dict,
  under llama.cpp's key names without the ``tokenizer.ggml.`` prefix, plus ``name`` and
  ``architecture`` (``general.*``)."""
  path = os.fspath(path)
  fields = read_header(path).metadata  # raises ValueError naming the file for what it cannot read
  keys = ("model", "pre", "tokens", "merges", "scores", "token_type", "bos_token_id",
          "eos_token_id", "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token")
  meta = {key: fields.get(f"tokenizer.ggml.{key}") for key in keys}
  meta["chat_template"] = fields.get("tokenizer.chat_template")
  meta["architecture"] = fields.get("general.architecture")
  meta["name"] = fields.get("general.name") or os.path.basename(path)
  return meta


def _pre_tokenizer(pre: str, name: str):
  from tokenizers import Regex, pre_tokenizers

  if pre not in PRE_TOKENIZERS:
    raise ValueError(f"GGUF model {name!r}: tokenizer.ggml.pre {pre!r} (the text split before "
                     f"the merges) is not supported yet; supported: {', '.join(PRE_TOKENIZERS)}")
  split = PRE_TOKENIZERS[pre]
  if split is None:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], name: str):
  """(backend, vocabulary, its alphabet) of a ``gpt2`` vocabulary: byte-level BPE over the file's
  merges, each token in GPT-2's byte spelling (a token holding characters outside that alphabet is
  respelled from its UTF-8 bytes, as transformers does)."""
  from tokenizers import Tokenizer, decoders, models

  if meta["merges"] is None:
    raise ValueError(f"GGUF model {name!r}: its tokenizer metadata lacks tokenizer.ggml.merges")
  spell = _byte_to_char()
  alphabet = set(spell.values())
  respell = lambda t: t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))
  vocab = {respell(t): i for i, t in enumerate(tokens)}
  merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
  backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False,
                                 continuing_subword_prefix="", end_of_word_suffix=""))
  backend.pre_tokenizer = _pre_tokenizer(meta["pre"] or "default", name)
  backend.decoder = decoders.ByteLevel()
  return backend, vocab, alphabet


def merges_from_ranks(vocab: dict[str, int], ranks: dict[str, float]) -> list[tuple[str, str]]:
  """The merges a SentencePiece BPE vocabulary implies (the file lists none): every split of a
  token into two tokens, best-ranked token first; among one token's splits the longer left part
  first, then the lower ids (transformers' ``generate_merges``, whose order the ids depend on)."""
  merges = []
  for token, rank in ranks.items():
    pairs = [(token[:i], token[i:]) for i in range(1, len(token))
             if token[:i] in vocab and token[i:] in vocab]
    pairs.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
    merges.extend((left, right, rank) for left, right in pairs)
  merges.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)  # stable
  return [(left, right) for left, right, _ in merges]


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str], name: str):
  """(backend, vocabulary) of a ``llama`` vocabulary: BPE with byte fallback over the file's
  merges, or ones rebuilt from its scores (Gemma: from its order); "▁" stands for the space."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

  gemma = meta["architecture"] in GEMMA_ARCHITECTURES
  if gemma:  # Gemma files store a token of spaces as spaces; its merges are spelled with "▁"
    tokens = [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
  vocab = {t: i for i, t in enumerate(tokens)}
  if meta["merges"] is not None:
    merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
  else:
    scores = meta["scores"]
    if not gemma and (scores is None or len(scores) != len(tokens)):
      raise ValueError(f"GGUF model {name!r}: its SentencePiece vocabulary has neither "
                       f"tokenizer.ggml.merges nor a score per token (tokenizer.ggml.scores)")
    ranks = ({t: -i for i, t in enumerate(tokens)} if gemma
             else {t: float(s) for t, s in zip(tokens, scores)})
    merges = merges_from_ranks(vocab, ranks)
  unk = meta["unknown_token_id"]
  backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=True,
                                 byte_fallback=True,
                                 unk_token=tokens[unk] if unk is not None else None))
  decode = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
  if gemma:  # (transformers also splits on " ", of which the normalizer has left none)
    backend.normalizer = normalizers.Replace(" ", _SPACE)
  else:  # "▁" before the first piece, stripped again by the decoder
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="first",
                                                     split=False)
    decode.append(decoders.Strip(content=" ", left=1, right=0))
  backend.decoder = decoders.Sequence(decode)
  return backend, vocab


def build_tokenizer(meta: dict[str, Any]):
  """A ``transformers.PreTrainedTokenizerFast`` from ``read_tokenizer_metadata``'s dict.

  The vocabulary's model (``_byte_level_bpe`` or ``_sentencepiece_bpe``), CONTROL tokens as
  special added tokens and USER_DEFINED ones as plain added tokens (both matched whole), BOS/EOS
  added by the post-processor only where the file says ``add_bos_token`` / ``add_eos_token``
  (a SentencePiece file that does not say gets a BOS).
  """
  from tokenizers import AddedToken, processors
  import transformers

  name, kind = meta["name"], meta["model"]
  if kind not in SUPPORTED_MODELS:
    raise ValueError(f"GGUF model {name!r}: tokenizer.ggml.model {kind!r} is not supported yet "
                     f"(supported: gpt2, byte-level BPE; llama, SentencePiece)")
  tokens, types = list(meta["tokens"] or ()), list(meta["token_type"] or ())
  if not tokens:
    raise ValueError(f"GGUF model {name!r}: its tokenizer metadata lacks tokenizer.ggml.tokens")
  if types and len(types) != len(tokens):
    raise ValueError(f"GGUF model {name!r}: {len(types)} token types for {len(tokens)} tokens")
  if kind == "gpt2":
    backend, vocab, alphabet = _byte_level_bpe(meta, tokens, name)
    # A CONTROL token spelled outside the byte alphabet is a llama.cpp mislabel (it is no real
    # token of a byte-level vocabulary); transformers skips it too.
    is_control = lambda t, k: k == _CONTROL and set(t) <= alphabet
  else:
    backend, vocab = _sentencepiece_bpe(meta, tokens, name)
    is_control = lambda t, k: k == _CONTROL
  backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                              for t, k in zip(tokens, types) if is_control(t, k)])
  backend.add_tokens([AddedToken(t, normalized=False, special=False)
                      for t, k in zip(tokens, types) if k == _USER_DEFINED and t in vocab])
  token = lambda key: tokens[meta[key]] if meta[key] is not None else None
  bos, eos = token("bos_token_id"), token("eos_token_id")
  add_bos = bool(meta["add_bos_token"] if meta["add_bos_token"] is not None else kind == "llama")
  add_eos = bool(meta["add_eos_token"])
  for flag, special, what in ((add_bos, bos, "BOS"), (add_eos, eos, "EOS")):
    if flag and special is None:
      raise ValueError(f"GGUF model {name!r} asks for a {what} token on every text but names none")
  # transformers' template (``TokenizersBackend.update_post_processor``): BOS/EOS around each text.
  single = [*([f"{bos}:0"] if add_bos else []), "$A:0", *([f"{eos}:0"] if add_eos else [])]
  pair = [*([f"{bos}:1"] if add_bos else []), "$B:1", *([f"{eos}:1"] if add_eos else [])]
  ids = {"bos": meta["bos_token_id"], "eos": meta["eos_token_id"]}
  backend.post_processor = processors.TemplateProcessing(
      single=single, pair=single + pair,
      special_tokens=[(t, ids[k]) for t, k, add in ((bos, "bos", add_bos), (eos, "eos", add_eos))
                      if add])
  # transformers' GemmaTokenizer also names a mask token (a CONTROL token of Gemma's vocabulary)
  gemma = kind == "llama" and meta["architecture"] in GEMMA_ARCHITECTURES
  mask = "<mask>" if gemma and "<mask>" in vocab else None
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token=token("unknown_token_id"),
      pad_token=token("padding_token_id"), chat_template=meta["chat_template"],
      mask_token=mask, add_bos_token=add_bos, add_eos_token=add_eos,
      clean_up_tokenization_spaces=False)


def load_gguf_tokenizer(path: str | os.PathLike):
  """The GGUF file's tokenizer (``build_tokenizer``: no torch), cached.

  Reading the vocabulary from the file takes seconds, so the tokenizer is saved with
  ``save_pretrained`` next to the converted weights and reloaded from there. A file without a
  chat template gets the one its registered checkpoint supplies, if any (matched by content:
  ``checkpoints.chat_template_for``), whether it was loaded by name or by path.
  """
  from transformers import PreTrainedTokenizerFast

  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file {path} does not exist")
  _, cached = _cache_files(path)
  if cached.is_dir():
    return PreTrainedTokenizerFast.from_pretrained(cached, local_files_only=True)
  meta = read_tokenizer_metadata(path)
  if meta["chat_template"] is None:
    meta["chat_template"] = checkpoints.chat_template_for(file_sha256(path))
  tokenizer = build_tokenizer(meta)
  try:
    with atomic_path(cached) as tmp:
      tokenizer.save_pretrained(tmp)
  except OSError as e:
    warnings.warn(f"could not cache the tokenizer of GGUF file {path} at {cached}: {e}")
  return tokenizer
