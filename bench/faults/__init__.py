"""Fault injection into real pskv jobs on 127.0.0.1: what the survivors see, how fast, and what is lost.

Every fault is injected into a job of real processes (``python -m pskv scheduler
--port-file F`` on a free port, ``python -m pskv server``, and ``bench/bench_faults.py _worker`` as
the worker script, or the same job under ``pskv launch``). Every child is reaped, whatever
happens, and every wait has a hard deadline: a fault that makes something hang shows up
as a HANG in the table, never as a hung benchmark.

    python bench/bench_faults.py                    # all faults, 3 runs each: ~3 min on 2 cores
    python bench/bench_faults.py --pskv-commit HEAD # pskv/ as committed, not the working tree
    python bench/bench_faults.py --only kill_server,fuzz --repeats 1
    python bench/bench_faults.py --only replace_worker,replace_server --json bench/results/faults_replacement.json
    python bench/bench_faults.py --only hostile --repeats 1 --json bench/results/faults_hostile.json

Rows (see docs/reliability.md for the discussion):

* kill_server / kill_worker / kill_scheduler: SIGKILL one node of a hand-started job
  (scheduler, 2 servers, 2 workers pushing and pulling 4 keys, two of them split over
  both servers), with the default heartbeat (1 s / 10 s) and a short one (0.5 s / 2 s); the survivors must raise ``NodeFailedError`` naming it. One more run
  of each under ``pskv launch`` gives the launcher's exit code and root-cause line.
* restart: SIGKILL server 0 under ``pskv launch --checkpoint-dir D --max-restarts 1``
  while the workers checkpoint every 4 steps; the final values must equal a crash-free
  run's bit for bit.
* replace_worker: SIGKILL worker 1 under ``pskv launch --restart-workers 1 --recovery-timeout 30``
  while it waits before pushing step 6 (it wrote the step to a file; its replacement, with
  ``kv.is_recovery``, goes on from there); replace_server: SIGKILL server 0 under ``pskv launch
  --restart-servers 1 --checkpoint-dir D --recovery-timeout 30`` after worker 0's step 5 (workers
  checkpoint every 4 steps and send the replacement their pushes since). Both: the time from the
  kill to the launcher's restart line, the replacement's first line, the scheduler's "rejoined"
  line and the first step completed after the kill; the launcher's lines; the final values must
  equal a crash-free run with the same options bit for bit.
* restart_exact: SIGKILL worker 1 at a random moment (uniform within 0.8 s after its first of 60
  steps) under ``pskv launch --restart-workers 1``; its replacement goes on from ``kv.resume_step()``
  (what the servers say of its rank's pushes); the final values must equal a crash-free run's bit
  for bit (``--repeats 20`` for the issue's bar).
* stop_worker: SIGSTOP worker 1 (it hangs without dying): the servers' stall report
  (``PSKV_STALL_REPORT`` 2 s, or 0.5 s with the short heartbeat) names it, then the
  heartbeat timeout ends the job; SIGCONT afterwards shows what the resumed worker sees.
* uneven: worker 0 has 3 batches, worker 1 has 5: without a mechanism worker 1 blocks
  (stall report, then ``OperationTimeoutError`` with ``PSKV_REQUEST_TIMEOUT=5``); with
  ``kv.join()`` or ``Trainer.fit(uneven=True)`` every epoch completes.
* fuzz: malformed messages (random bytes, truncated frames, bad dtype codes, shapes that
  do not match the data, huge declared sizes, bad fields, requests for keys the job does
  not use) sent to a live server from a plain ZeroMQ socket; the workers' results must
  stay exact; also how long one 14 MB header holds the server up. forged: one
  well-formed message claiming worker 0's id per run (a PUSH of the job's key with a
  wrong dtype or shape, a data-less PUSH naming the key in its shared-memory list, a
  JOIN): pskv does not authenticate peers without CURVE.
* hostile (``hostile_<category>`` for one): slow reader, many frames, oversize, forged
  sender, replay, Unix-socket junk, state growth, chosen paths against a live server
  (:mod:`.hostile` describes each); per category the inputs tried, crashes, hangs, wrong
  values and the server's RSS, in a table of its own.

Acknowledged updates: the training workers use ``SGD(learning_rate=1)`` on the servers
and push ``-v``, so every completed round adds the sum of the pushes exactly (small
integers in float32); each worker checks every pulled value against the sum of all
rounds it saw acknowledged so far. "lost" counts rounds whose pulled values differ.

Output: a markdown table on stdout (progress on stderr) and ``bench/results/faults.json``.
The repeats of a row run at the same time as independent jobs (``--parallel``, default
3): most of a fault run is waiting for a heartbeat timeout, and the workers are paced
(50 steps/s) so the machine stays mostly idle. ``--parallel 1`` runs them one by one.

The program is this package; ``bench/bench_faults.py`` runs it (and is the worker script):

* :mod:`.settings` — the jobs' sizes, heartbeats and environment; which ``pskv/`` is measured.
* :mod:`.workers` — the worker entry points (``bench_faults.py _worker SPEC.json``).
* :mod:`.harness` — processes with timestamped output, hand-started jobs, ``pskv launch``, the reaper.
* :mod:`.trials` — one function per kind of run; :func:`.trials.plan` lists the runs of the chosen rows.
* :mod:`.report` — one function per table row.
* :mod:`.hostile` — the hostile categories: their attacks, trial and table.
* :mod:`.__main__` — options, the thread pool, the JSON file.
"""
