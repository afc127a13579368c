"""The runner's models: the specjax target and draft (and transformers' when an ``hf_*`` method
runs), the tokenizer, and prompt encoding; ``load_pair`` gives the side tools the same."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from experiments import prompts as prompts_lib
from experiments import resolve, runconfig
from experiments.errors import ConfigError
from experiments.errors import log as _log
from experiments.methods import METHODS


class Models:
  """Loaded models (specjax, and transformers when an hf_* method runs) and the tokenizer."""

  def __init__(self, config, specs: dict, tmpdir: str):
    import specjax as sj
    from experiments import random_models

    self.specs = specs
    self.sj: dict[str, Any] = {}
    seed = int(config.seed)
    for role, spec in specs.items():
      t0 = time.perf_counter()
      if spec.random_name is not None:
        self.sj[role] = random_models.build(spec.random_name, seed=seed)
      elif role == "draft" and config.draft_vocab == "auto":
        self.sj[role] = sj.load_model(spec.path, dtype=config.dtype, head="auto")
      else:
        self.sj[role] = sj.load_model(spec.path, dtype=config.dtype)
      kept = getattr(self.sj[role], "kept_ids", None)
      _log(f"[run] loaded {role} {spec.spec}: {self.sj[role].config.num_params() / 1e6:.2f}M "
           f"parameters" + (f", a {kept.shape[0]}-token head" if kept is not None else "")
           + f" ({time.perf_counter() - t0:.1f}s)")
    self.heads: dict[str, dict] = {}  # EAGLE head field -> its path, kind and size
    for field in sorted({METHODS[m].head for m in config.methods if METHODS[m].head}):
      self.sj[field] = self._load_head(config, field)
    if config.tokenizer == "bytes" or (config.tokenizer == "" and specs["target"].path is None):
      self.tokenizer = random_models.ByteTokenizer()
    else:
      self.tokenizer = sj.load_tokenizer(config.tokenizer or specs["target"].path)
    self.hf: dict[str, Any] = {}
    if any(METHODS[m].hf for m in config.methods):
      self._load_hf(config, tmpdir)

  def _load_head(self, config, field: str):
    """The EAGLE head of ``config[field]`` (``resolve.resolve_heads`` made it a directory or
    ``UNTRAINED``: a random head of the kind for the random target)."""
    import jax
    from flax import nnx

    import specjax as sj
    from specjax.heads.eagle import init_head
    from specjax.heads.eagle3 import init_head3
    from specjax.heads.hydra import init_hydra
    from specjax.heads.medusa import init_medusa
    from specjax.heads.mtp import init_mtp
    t0 = time.perf_counter()
    if config[field] == resolve.UNTRAINED:
      init = {"eagle3_head": init_head3, "medusa_heads": init_medusa,
              "hydra_heads": init_hydra, "mtp_head": init_mtp}.get(field, init_head)
      head = init(self.sj["target"].config, key=int(config.seed))
    else:
      head = sj.load_head(config[field], dtype=config.dtype)
    size = int(sum(x.size for x in jax.tree.leaves(nnx.state(head, nnx.Param))))
    self.heads[field] = {"path": config[field], "kind": type(head).__name__, "params": size}
    _log(f"[run] loaded {field} {config[field]}: {size / 1e6:.2f}M parameters "
         f"({time.perf_counter() - t0:.1f}s)")
    return head

  def _load_hf(self, config, tmpdir: str):
    try:
      import torch
      import transformers
    except ImportError as e:  # validate() checked find_spec; this is a broken install
      raise ConfigError(f"hf_* methods need torch and transformers: {e}") from None
    transformers.logging.set_verbosity_error()  # its per-call deprecation chatter
    import specjax as sj
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    for role, spec in self.specs.items():
      path = spec.path
      if path is None:  # a random model: write it as an HF checkpoint first
        path = os.path.join(tmpdir, role)
        sj.save_model(self.sj[role], path)
      if path.lower().endswith(".gguf"):  # transformers dequantizes the same file
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype)
      else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
      self.hf[role] = model.eval()

  def encode(self, texts: list[str], max_tokens: int, add_bos: bool,
             chat: bool = False) -> list[list[int]]:
    """Token ids per prompt, cut to their last ``max_tokens``. ``chat``: each text becomes a user
    message in the tokenizer's chat template, ending where the assistant's reply starts."""
    if chat and not getattr(self.tokenizer, "chat_template", None):
      raise ConfigError(f"chat_template is set, but the tokenizer ({type(self.tokenizer).__name__}"
                        f" of {self.specs['target'].spec}) has no chat template: set "
                        f"chat_template=False (the tools: --nochat_template)")
    bos = getattr(self.tokenizer, "bos_token_id", None) if add_bos and not chat else None
    out, cut = [], []
    for text in texts:
      if chat:
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                  tokenize=False, add_generation_prompt=True)
      ids = list(self.tokenizer.encode(text, add_special_tokens=False))
      if bos is not None:
        ids = [int(bos)] + ids
      out.append([int(i) for i in ids[-max_tokens:]])
      if len(ids) > max_tokens:
        cut.append(len(ids))
    if cut:  # said, not silent: a chat prompt loses its template's head, a code prompt its start
      _log(f"[run] {len(cut)} of {len(texts)} prompts ({min(cut)}-{max(cut)} tokens) are longer "
           f"than max_prompt_tokens={max_tokens} and keep their last {max_tokens} tokens")
    return out

  def decode(self, ids) -> str:
    return self.tokenizer.decode([int(i) for i in ids if int(i) >= 0])


def load_pair(target: str, draft: str | None, prompts: str, batch_size: int, prompt_tokens: int,
              gammas, temperature: float, max_new_tokens: int, chat_template: bool = False):
  """For the side tools (cost_split, tree_vs_chain, search_skip): the runner's own config checks,
  checkpoint resolution ("default" builds the embedded pair on first use), model loading and
  prompt encoding (BOS included), so that every tool times the same thing. Returns (target, draft,
  prompts, specs), the draft None (not loaded) when ``draft`` is None; raises
  ``runconfig.ConfigError`` with a one-line message."""
  config = runconfig.base_config()
  config.target, config.draft, config.prompts = target, draft or runconfig.DEFAULT, prompts
  if draft is None:
    config.methods = ("autoregressive",)
  config.gammas = tuple(int(g) for g in gammas)
  config.temperatures = (temperature,)
  config.batch_size = batch_size
  config.max_prompt_tokens = prompt_tokens
  config.max_new_tokens = max_new_tokens
  runconfig.validate(config)
  specs = resolve.resolve_checkpoints(config)
  texts = prompts_lib.load_prompts(prompts)
  if len(texts) < batch_size:
    raise ConfigError(f"--batch_size={batch_size} needs that many prompts; {prompts!r} has "
                      f"{len(texts)}")
  with tempfile.TemporaryDirectory() as tmpdir:
    models = Models(config, specs, tmpdir)
  encoded = models.encode(texts[:batch_size], prompt_tokens, bool(config.add_bos),
                          chat_template)
  return models.sj["target"], models.sj.get("draft"), encoded, specs


def load_pair_for_tool(*args, **kwargs):
  """``load_pair`` for a command-line tool: its ``ConfigError`` becomes absl's usage error (the
  tool's usage and the one-line reason, no traceback)."""
  from absl import app
  try:
    return load_pair(*args, **kwargs)
  except ConfigError as e:
    raise app.UsageError(str(e)) from None
