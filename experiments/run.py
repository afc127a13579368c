r"""Speculative-decoding experiments: sweeps, interleaved timing, report with tables and plots.

    python -m experiments.run --config=configs/default.py
    python -m experiments.run --config=configs/leviathan.py:gamma=2,temperature=1
    python -m experiments.run --config=configs/tiny.py --config.output_dir=/tmp/tiny \
        --config.gammas=1,2 --config.repeats=2

A config (``configs/*.py``, fields in ``experiments/runconfig.py``) names the target and draft
checkpoints, the prompts, the methods and the sweeps (gammas, temperatures), batch size, token
budget, repeats and the output directory. The run:

1. validates the config (one line per problem, before anything heavy);
2. loads the models once and tokenizes the prompts;
3. measures the draft/target cost ratio c (one jitted decoding step of each, interleaved);
4. warms up (compiles) every setting (method, gamma, sampling) once, on the first batch (all
   batches share one padded shape), timing it separately;
5. times ``repeats`` passes with the settings *interleaved* batch by batch (AR, spec g=1, spec g=2,
   ..., AR, ...; the starting setting rotates), so machine noise hits all of them alike;
   tokens/s is the median over repeats;
6. prints a table, the greedy continuations of one prompt by AR and speculative decoding, and
   writes ``results.json``, ``report.md`` and PNG plots to ``output_dir``.

Devices: ``config.meshes`` runs every setting on one device ("") and on meshes ("2x4": 2
data-parallel x 4 tensor-parallel devices, ``specjax.sharding``) side by side;
``--multihost`` makes this process one of several (``jax.distributed.initialize``; see
``experiments/launch_local.py``), and process 0 alone writes the report.

``run_experiment(config)`` does the same in-process and returns the results dict.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shlex
import sys
import tempfile
import time

from absl import app, flags
from ml_collections import config_flags

from experiments import prompts as prompts_lib
from experiments import resolve, runconfig
from experiments.errors import ConfigError
from experiments.errors import log as _log
from experiments.methods import COST_RULES, METHODS, adaptive_table
from experiments.runconfig import setting_label

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiment config file, e.g. configs/default.py[:key=value,...]",
    lock_config=True)
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "one process of a multi-host run: jax.distributed.initialize() (cluster "
    "auto-detection on TPU VMs, SLURM, Open MPI, or the three flags below), then every process "
    "runs the same program over the global mesh; process 0 writes the report")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "multihost: host:port of process 0 (default: auto-detect)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "multihost: how many processes")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "multihost: this process's index")


def start_jax(config, multihost: bool = False, coordinator_address: str | None = None,
              num_processes: int | None = None, process_id: int | None = None) -> None:
  """Sets what must be set before JAX starts its backends: ``config.cpu_devices`` host devices,
  and (``multihost``) the distributed runtime with CPU collectives over gloo (ignored on
  accelerators)."""
  import jax
  if config.cpu_devices:
    try:
      jax.config.update("jax_num_cpu_devices", int(config.cpu_devices))
    except RuntimeError:
      pass  # JAX has started already: checked below
  if multihost:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  if config.cpu_devices and jax.default_backend() == "cpu" and (
      jax.local_device_count() != int(config.cpu_devices)):
    raise ConfigError(f"cpu_devices={config.cpu_devices}, but JAX has started with "
                      f"{jax.local_device_count()} devices in this process: set it before JAX "
                      f"starts (a fresh process, or "
                      f"XLA_FLAGS=--xla_force_host_platform_device_count={config.cpu_devices})")


def _one_line(msg: str) -> str:
  return " ".join(str(msg).split())


# ------------------------------------------------------------------------------------- settings


def make_settings(config) -> list[dict]:
  """Every (method, sweep value, temperature, mesh) to time, in interleaving order
  (temperature-major); a method's sweep (gammas, tree or lookahead specs) is its ``METHODS``
  entry's."""
  settings = []
  for t in config.temperatures:
    for m in config.methods:
      for value in runconfig.sweep_values(config, m):
        for mesh in (("",) if METHODS[m].hf else tuple(config.meshes)):
          settings.append(runconfig.setting(config, m, value, t, mesh))
  return settings


# ------------------------------------------------------------------------------------ experiment


def _versions() -> dict:
  import importlib.metadata as md
  out = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "flax", "numpy", "transformers", "torch", "ml_collections"):
    try:
      out[name] = md.version(name)
    except md.PackageNotFoundError:
      pass
  try:
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "setup.cfg"))
    out["specjax"] = cfg.get("metadata", "version")
  except Exception:  # pylint: disable=broad-except
    pass
  return out


def _machine() -> dict:
  import jax
  devices = jax.devices()
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "jax_backend": jax.default_backend(),
          "devices": sorted({str(d.device_kind) for d in devices}),
          "device_count": len(devices), "process_count": jax.process_count()}


def _progress(total: int, desc: str, enabled: bool):
  import jax
  if not enabled or jax.process_index() != 0:
    return contextlib.nullcontext(None)
  from tqdm.auto import tqdm
  return tqdm(total=total, desc=desc, unit="call", file=sys.stderr, dynamic_ncols=True,
              leave=True)


def _check_meshes(config, specs: dict) -> None:
  """Every mesh of ``config.meshes`` fits the devices and splits every model: ConfigError
  otherwise, before any model is loaded."""
  import jax

  from experiments import random_models
  from specjax import sharding
  from specjax.models.hf_config import from_hf_dict
  for spec in config.meshes:
    sizes = runconfig.parse_mesh_spec(spec)
    if not sizes:
      continue
    if sizes[0] * sizes[1] != jax.device_count():
      raise ConfigError(
          f"meshes entry {spec!r} needs {sizes[0] * sizes[1]} devices, but there are "
          f"{jax.device_count()}" + (
              f" (on a CPU: cpu_devices={sizes[0] * sizes[1] // jax.process_count()})"
              if jax.default_backend() == "cpu" else ""))
    if int(config.batch_size) % sizes[0]:
      raise ConfigError(f"meshes entry {spec!r}: batch_size {config.batch_size} does not divide "
                        f"its data axis of {sizes[0]} devices")
    for role, model in specs.items():
      rules = (sharding.REPLICATED if role == "draft" and config.draft_sharding == "replicated"
               else sharding.RULES)
      model_config = (random_models.model_config(model.random_name) if model.random_name
                      else from_hf_dict(model.hf_config))
      try:
        sharding.check_config(model_config, *sizes, rules, role)
      except ValueError as e:
        raise ConfigError(f"meshes entry {spec!r}: {e}") from None


def run_experiment(config, command: str | None = None) -> dict:
  """Runs the experiment of ``config``; writes the report; returns the results dict.

  Raises ``ConfigError`` (a ``ValueError``) with a one-line message on a bad config, before any
  model is loaded.
  """
  t_start = time.perf_counter()
  runconfig.validate(config)
  settings = make_settings(config)
  if config.dry_run:
    plan = {"dry_run": True, "settings": settings, "config": config.to_dict()}
    print(f"[run] dry run: {len(settings)} settings")
    for s in settings:
      print(f"  {setting_label(s)}")
    return plan
  specs = resolve.resolve_checkpoints(config)
  start_jax(config)  # cpu_devices (main() has already started JAX, multi-host or not)
  _check_meshes(config, specs)
  texts = prompts_lib.load_prompts(config.prompts)
  if config.num_prompts:
    texts = texts[:config.num_prompts]
  if config.sample_prompt >= len(texts):
    raise ConfigError(f"sample_prompt {config.sample_prompt} is out of range: there are "
                      f"{len(texts)} prompts")

  import numpy as np

  from experiments import analysis
  from experiments import report as report_lib
  from experiments.models import Models
  from experiments.runner import Runner, StatsSum
  from experiments.timing import measure_run_costs

  with tempfile.TemporaryDirectory(prefix="specjax-run-") as tmpdir:
    models = Models(config, specs, tmpdir)
    prompts = models.encode(texts, int(config.max_prompt_tokens), bool(config.add_bos),
                            bool(config.chat_template))
    bsz = int(config.batch_size)
    # Fill the last batch by cycling the prompts: every batch has the same shape.
    n_rows = -(-len(prompts) // bsz) * bsz
    rows = [prompts[i % len(prompts)] for i in range(n_rows)]
    batches = [rows[i:i + bsz] for i in range(0, n_rows, bsz)]
    prompt_lengths = [len(p) for p in prompts]
    _log(f"[run] {len(texts)} prompts ({config.prompts}), {min(prompt_lengths)}-"
         f"{max(prompt_lengths)} tokens; {len(batches)} batches of {bsz}; {len(settings)} settings; "
         f"{config.repeats} repeats")
    # The cost ratio c and every setting's pass costs, inside jitted loops at the run's batch.
    cost = measure_run_costs(config, models.sj, settings, prompt_lengths, bsz)
    # Each adaptive setting decides by (and its row records) the table measured for its base.
    settings = [dict(s, cost_table=adaptive_table(cost, s["base"], s["temperature"]))
                if s.get("rule") else s for s in settings]

    runner = Runner(config, models, prompt_width=max(prompt_lengths))
    records = [dict(s, warmup_s=0.0, times=[], tokens=[], first_batch_s=[], stats=StatsSum(),
                    outputs=None) for s in settings]
    from specjax.decoding.adaptive_calibration import CalibrationNoise
    calibrated: dict = {}  # one calibration per menu, base and sampling, shared by its rules
    for rec in records:  # a cost rule's menu priced by its own loop (sj.Adaptive.calibrated)
      if rec.get("rule") in COST_RULES and config.adaptive_calibration and rec.get("cost_table"):
        shape = tuple(str(rec.get(k)) for k in ("base", "base_tree", "choices", "temperature",
                                                 "mesh"))
        first = calibrated.get(shape)
        if first is not None:  # the same prices as the setting that timed them
          rec.update(cost_table=first["cost_table"], calibration_s=0.0,
                     calibration_from=setting_label(first))
          if "calibration_error" in first:
            rec["calibration_error"] = first["calibration_error"]
          continue
        calibrated[shape] = rec
        _log(f"[run] calibrating {setting_label(rec)} on the first batch")
        start = time.perf_counter()
        try:
          rec["cost_table"] = runner.calibrate(rec, batches[0])
        except CalibrationNoise as error:  # the bare table, said in the log, row and report
          rec["calibration_error"] = str(error)
          _log(f"[run] {setting_label(rec)}: {error}; priced by the bare table")
        rec["calibration_s"] = time.perf_counter() - start

    # Warm-up: compile every setting once, on the first batch (all batches share one padded
    # shape, so the others run the same executable), timed apart.
    with _progress(len(records), "warm-up (compile)", config.progress) as bar:
      for rec in records:
        if bar is not None:
          bar.set_postfix_str(setting_label(rec), refresh=False)
        rec["warmup_s"], _, stats = runner(rec, batches[0], (0, 0))
        if rec.get("rule") in COST_RULES and config.adaptive_warm:  # the timed calls start
          warmed = runner.method(rec)[1].warmed(stats)  # from its end (sj.Adaptive.warmed)
          rec.update(prior=list(warmed.prior), prior_evidence=list(warmed.prior_evidence),
                     probe_cost=warmed.probe_cost)
          if rec["rule"] == "checked":  # and the check's tally
            rec["prior_tally"] = np.asarray(warmed.prior_tally, np.float64).tolist()
          if runner.skips_draft(rec, batches[0]):  # its skip cycle's plain loop compiled too
            runner(rec, batches[0], (0, 0))
            rec.pop("draft_skips")
        rec["memory"] = runner.memory(rec, batches[0])
        if bar is not None:
          bar.update(1)

    # Timed repeats, interleaved: for each repeat and batch, every setting in turn; the starting
    # setting rotates, so that no setting always runs right after the same neighbour. The first
    # repeat's outputs are each setting's outputs (samples, greedy = AR, their hash).
    with _progress(int(config.repeats) * len(batches) * len(records), "timed runs",
                   config.progress) as bar:
      for r in range(int(config.repeats)):
        per = [[0.0, 0] for _ in records]
        outs = [[] for _ in records]
        for b, batch in enumerate(batches):
          shift = (r * len(batches) + b) % len(records)
          for i in [*range(shift, len(records)), *range(shift)]:
            rec = records[i]
            seconds, tokens, stats = runner(rec, batch, (r + 1, b))
            per[i][0] += seconds
            per[i][1] += int(np.sum(tokens >= 0))
            outs[i].append(tokens)
            if b == 0:
              rec["first_batch_s"].append(seconds)
            rec["stats"].add(stats)
            if bar is not None:
              bar.update(1)
        for rec, (seconds, ntok), out in zip(records, per, outs):
          rec["times"].append(seconds)
          rec["tokens"].append(ntok)
          if r == 0:
            rec["outputs"] = np.concatenate(out)[:len(prompts)]

    if config.profile_dir:  # one more call of every setting, traced (after the timed runs)
      import jax
      with jax.profiler.trace(config.profile_dir):
        for rec in records:
          with jax.profiler.TraceAnnotation(setting_label(rec)):
            runner(rec, batches[0], (0, 0))
      _log(f"[run] profiler trace of one call per setting in {config.profile_dir} (open it with "
           f"TensorBoard's profile plugin or Perfetto)")

  figures = analysis.analyse(config, records, cost, texts, models.decode)
  results = {
      "name": config.name,
      "created": datetime.datetime.now().isoformat(timespec="seconds"),
      "command": command or "(in-process: experiments.run.run_experiment)",
      "config": config.to_dict(),
      "versions": _versions(),
      "machine": _machine(),
      "models": {role: {"spec": s.spec, "path": s.path,
                        "params": int(models.sj[role].config.num_params()),
                        "layers": models.sj[role].config.num_layers,
                        "hidden_size": models.sj[role].config.hidden_size,
                        "vocab_size": s.vocab_size} for role, s in specs.items()},
      "heads": models.heads,
      "prompts": {"source": config.prompts, "count": len(texts),
                  "tokens_min": min(prompt_lengths), "tokens_max": max(prompt_lengths),
                  "tokens_mean": float(np.mean(prompt_lengths)), "batches": len(batches),
                  "batch_size": bsz},
      "cost": cost,
      "optimal_gamma": figures["optimal_gamma"],
      "settings": figures["settings"],
      "samples": figures["samples"],
      "wall_s": time.perf_counter() - t_start,
  }
  import jax
  if jax.process_index() != 0:  # a multi-host run: process 0 alone writes and prints
    return results
  paths = report_lib.write_report(results, config.output_dir, plots=bool(config.plots))
  results["files"] = paths
  print(report_lib.format_table(results))
  print(report_lib.format_samples(results))
  print(f"\n[run] wrote {', '.join(sorted(os.path.basename(p) for p in paths.values()))} to "
        f"{config.output_dir} ({results['wall_s']:.0f}s)")
  return results


# ------------------------------------------------------------------------------------------ main


def command_line(argv) -> str:
  return "python -m experiments.run " + " ".join(shlex.quote(a) for a in argv[1:])


def _flag_error_line(e: BaseException) -> str:
  """One line from a flag-parsing error; for errors raised inside a config file's get_config
  (which config_flags wraps with the traceback), the exception's own last line."""
  text = str(e)
  lines = [l.strip() for l in text.splitlines() if l.strip()]
  if "Traceback (most recent call last)" in text and lines:
    last = lines[-1]
    head, sep, tail = last.partition(": ")
    return tail if sep and head.rsplit(".", 1)[-1].endswith(("Error", "Exception")) else last
  return _one_line(text)


def _parse_flags(argv):
  """absl's flag parsing, with any error printed as one line (not absl's usage dump)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f"error: {_flag_error_line(e)}")
  except (AttributeError, KeyError) as e:  # --config.<unknown field>=...
    bad = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    sys.exit(f"error: unknown config field {_one_line(e).strip(chr(34) + chr(39))} (in {', '.join(bad)}); the fields are "
             f"listed in experiments/runconfig.py:base_config")


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments: {' '.join(argv[1:])} (did you mean --config.x=...?)")
  from absl import logging
  if not flags.FLAGS["verbosity"].present:  # orbax logs each checkpoint save at INFO
    logging.set_verbosity(logging.WARNING)
  try:
    config = _CONFIG.value
    if config is None:
      sys.exit("error: --config is required, e.g. --config=configs/default.py")
    config.keys()  # config_flags reports a missing/broken config file only on first access
  except OSError as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    sys.exit(f"error: cannot load the config file: {lines[-1] if lines else e}")
  try:
    runconfig.validate(config)
    start_jax(config, _MULTIHOST.value, _COORDINATOR.value, _NUM_PROCESSES.value,
              _PROCESS_ID.value)
    run_experiment(config, command=command_line(sys.argv))
  except ConfigError as e:
    sys.exit(f"error: {_one_line(e)}")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
