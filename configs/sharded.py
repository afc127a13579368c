r"""One program on one device and on a 2 x 4 mesh, side by side (specjax.sharding).

    # 8 host devices on a CPU (fake devices sharing its cores: a check, not a speedup):
    python -m experiments.run --config=configs/sharded.py
    # The same on 2 processes x 4 devices (jax.distributed, CPU collectives over gloo):
    python -m experiments.launch_local --processes=2 -- \
        python -m experiments.run --config=configs/sharded.py --config.cpu_devices=4 --multihost
    # A GPU or TPU host with 8 chips: no fake devices
    python -m experiments.run --config=configs/sharded.py --config.cpu_devices=0
    # Quick: the tiny random pair
    python -m experiments.run --config=configs/sharded.py:tiny

The target is a random 8-layer x 1024 Llama (GQA 16/8, 113M parameters; the "wide" family of
experiments/random_models.py), its draft the target's first layer. Every setting runs on one
device ("") and on a mesh of 2 data-parallel x 4 tensor-parallel devices ("2x4"): heads, kv
heads, MLP units and vocabulary split four ways, the batch of 8 two ways. The report gives each
sharded row's tokens/s over the same setting on one device ("x 1 device"), checks that its
tokens are the same ("same tokens") and lists the compiled loop's memory per device.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "sharded"
  c.target = "random:wide-target"
  c.draft = "random:wide-draft"
  c.prompts = "python-tiny"
  c.max_prompt_tokens = 32
  c.methods = ("autoregressive", "speculative")
  c.gammas = (3,)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 8
  c.max_new_tokens = 32
  c.repeats = 2
  c.meshes = ("", "2x4")
  c.cpu_devices = 8
  c.output_dir = "runs/sharded"
  if arg == "tiny":  # seconds: the tiny random pair (tests/test_multihost.py runs it)
    c.target, c.draft = "random:tiny-target", "random:tiny-draft"
    c.meshes = ("", "4x2")  # its 2 kv heads split over 2 devices at most
    c.max_new_tokens, c.repeats, c.plots, c.progress = 8, 1, False, False
    c.output_dir = "runs/sharded_tiny"
    arg = None
  return runconfig.apply_arg(c, arg)
