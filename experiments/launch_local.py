r"""Starts N processes of one command on this machine as one multi-host JAX run (for testing).

    python -m experiments.launch_local --processes=2 -- \
        python -m experiments.run --config=configs/sharded.py --config.cpu_devices=4 --multihost

Each process gets the command plus ``--coordinator_address=localhost:PORT --num_processes=N
--process_id=I`` (the flags ``experiments.run --multihost`` hands to
``jax.distributed.initialize``); process 0 hosts the coordinator. The processes share this
terminal; the launcher waits for all, stops the others when one fails, and exits with the first
failure's status. With ``--config.cpu_devices=D`` every process runs D host devices and the
global mesh spans N x D of them, with CPU collectives over gloo.

Elsewhere no launcher is needed, since ``jax.distributed.initialize()`` finds its peers itself:

* TPU VM pod slice: run the same command on every worker, e.g.
  ``gcloud compute tpus tpu-vm ssh NAME --worker=all --command="cd specjax && python -m
  experiments.run --config=configs/sharded.py --config.cpu_devices=0 --multihost"``;
* SLURM (one task per host or per GPU): ``srun python -m experiments.run ... --multihost``;
* any other cluster: start one process per host with the three flags above set by hand.

One host with several GPUs needs no multi-host run at all: one process sees every GPU.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(command: list[str], processes: int, port: int | None = None,
           poll_s: float = 0.2) -> int:
  """Runs ``command`` as ``processes`` cooperating processes; returns the exit status (0 when
  every process succeeded, else the first failure's)."""
  if processes < 1:
    raise ValueError(f"processes must be >= 1, got {processes}")
  if not command:
    raise ValueError("no command given: put it after '--'")
  port = port or free_port()
  procs = [subprocess.Popen(command + [f"--coordinator_address=localhost:{port}",
                                       f"--num_processes={processes}", f"--process_id={i}"])
           for i in range(processes)]
  status = 0
  try:
    while True:
      codes = [p.poll() for p in procs]  # every process polled (any() would stop at the first)
      failed = [c for c in codes if c not in (None, 0)]
      if failed or None not in codes:
        status = failed[0] if failed else 0
        break
      time.sleep(poll_s)
  finally:
    for p in procs:
      if p.poll() is None:
        p.terminate()
    for p in procs:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()
  return status


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if "--" not in argv:
    sys.exit("usage: python -m experiments.launch_local --processes=N [--port=P] -- COMMAND ...")
  split = argv.index("--")
  parser = argparse.ArgumentParser(prog="python -m experiments.launch_local")
  parser.add_argument("--processes", type=int, default=2, help="how many processes")
  parser.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
  args = parser.parse_args(argv[:split])
  try:
    return launch(argv[split + 1:], args.processes, args.port)
  except ValueError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  sys.exit(main())
