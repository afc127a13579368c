r"""Tiny random models, seconds of decoding: the runner's smoke test (tests/test_run.py) and a demo.

    python -m experiments.run --config=configs/tiny.py
    python -m experiments.run --config=configs/tiny.py:gamma=2,temperature=1 --config.repeats=1

The target is a 4-layer random Llama (vocabulary 256, byte tokenizer) with a peaked output head;
the draft is its first layer (experiments/random_models.py). No training, no files read.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "tiny"
  c.target = "random:tiny-target"
  c.draft = "random:tiny-draft"
  c.prompts = "python-tiny"
  c.max_prompt_tokens = 32
  c.methods = ("autoregressive", "speculative")
  c.gammas = (1, 3)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 2
  c.max_new_tokens = 16
  c.repeats = 2
  # Random tiny models' iterations are dispatch and noise: an adaptive cost rule keeps the bare
  # passes' prices (the runner's calibration is tested with a clock by hand).
  c.adaptive_calibration = 0
  c.output_dir = "runs/tiny"
  return runconfig.apply_arg(c, arg)
