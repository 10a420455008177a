"""The table: one function per row, from the runs' results (:func:`summarize`), and its markdown.

Each ``*_row`` function returns the row's dict (``row``, ``fault``, ``how``, ``outcome``,
``detect``, ``detect_text``, ``lost``, ``lost_text``, ``notes``), or None when the row was
not run, and appends what it finds wrong to ``defects``.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from .harness import strip_log
from .settings import (
    DEFAULT_HB,
    EXTRA_STEPS,
    RECOVERY_TIMEOUT,
    REPLACE_SERVER_STEP,
    REPLACE_WORKER_STEP,
    SHORT_HB,
    STOP_DEFAULT,
    STOP_SHORT,
)
from .trials import FORGED


def stat(values: list[Any]) -> dict[str, Any] | None:
    """Median, min, max and count of the values that are not None (None if there are none)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 2), "min": round(min(vals), 2), "max": round(max(vals), 2),
            "n": len(vals), "samples": vals}


def fmt_stat(s: dict[str, Any] | None, of: int, digits: int = 1) -> str:
    if s is None:
        return "none"
    text = f"{s['median']:.{digits}f} s ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
    return text + (f", {s['n']} of {of} runs" if s["n"] != of else "")


def _err_summary(errs: list[dict[str, Any] | None], expect_node: str) -> str:
    got = [e for e in errs if e]
    if not got:
        return "no error"
    kinds = sorted({f"{e['type']}" + ("" if e.get("typed") else " (UNTYPED)") for e in got})
    named = sum(1 for e in got if expect_node in (e.get("node") or "") or f"{expect_node} " in e["msg"]
                or f"{expect_node} failed" in e["msg"])
    sample = got[0]["msg"].split("\n")[0][:110]
    return f"{'/'.join(kinds)} naming {expect_node} in {named}/{len(got)} (`{sample}`)"


def _exit_codes(rs: list[dict[str, Any]], names: list[str]) -> str:
    parts = []
    for n in names:
        codes = sorted({r["exit_codes"].get(n) for r in rs if "exit_codes" in r}, key=str)
        parts.append(f"{n} exit {'/'.join('hung' if c is None else str(c) for c in codes)}")
    return ", ".join(parts)


def _short_restart(rs: list[dict[str, Any]]) -> str:
    line = next((r.get("restart_line") for r in rs if r.get("restart_line")), "") or ""
    return line.split(" from checkpoint ")[0] + (" from checkpoint .../ckpt-1" if "ckpt-1" in line else "")


def _close_text(ev: dict[str, Any] | None) -> str:
    if not ev:
        return "no close event"
    if ev["ev"] == "closed":
        return f"close() returned after {ev['seconds']:.1f} s"
    return f"close() raised {ev['type']} after {ev['seconds']:.1f} s"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| fault injected | how injected | outcome | time to detection (median, min-max) | "
            "acknowledged updates lost | notes |\n|---|---|---|---|---|---|\n")
    body = "".join(f"| {r['fault']} | {r['how']} | {r['outcome'].replace('|', '/')} | {r['detect_text']} | "
                   f"{r['lost_text']} | {r['notes']} |\n" for r in rows)
    return head + body


Runs = dict[str, list[dict[str, Any]]]


def summarize(results: list[dict[str, Any]], repeats: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The table rows (in table order) and the defects found, from every run's result."""
    by: Runs = {}
    for r in results:
        by.setdefault(r["label"].split("#")[0], []).append(r)
    defects: list[str] = []
    rows: list[dict[str, Any] | None] = []
    for base, victim in (("kill_server", "server 1"), ("kill_worker", "worker 1"), ("kill_scheduler", "scheduler")):
        for short in (False, True):
            rows.append(kill_row(by, base, victim, short, repeats, defects))
    rows.append(restart_row(by, repeats, defects))
    for role in ("worker", "server"):
        rows.append(replace_row(by, role, repeats, defects))
    rows.append(restart_exact_row(by, repeats, defects))
    for short in (False, True):
        rows.append(stop_row(by, short, repeats, defects))
    rows.append(uneven_none_row(by, repeats, defects))
    for variant in ("join", "fit"):
        rows.append(uneven_completes_row(by, variant, defects))
    rows.append(fuzz_row(by, repeats, defects))
    rows.append(forged_row(by, defects))
    return [r for r in rows if r is not None], defects


def _hb_text(short: bool) -> str:
    hb = SHORT_HB if short else DEFAULT_HB
    return f"heartbeat {hb['PS_HEARTBEAT_INTERVAL']} s / timeout {hb['PS_HEARTBEAT_TIMEOUT']} s"


def _launch_text(by: Runs, row: str) -> str | None:
    lv = by.get(row + ":launch", [])
    if lv and lv[0]["ok"]:
        return f"under `pskv launch`: exit {lv[0]['exit_code']}, `{lv[0]['root_cause']}`"
    return None


def _kill_outcome(by: Runs, row: str, rs: list[dict[str, Any]], victim: str, survivors: list[str]) -> list[str]:
    werrs = [r["survivors"][w].get("error") for r in rs for w in survivors if w.startswith("worker")]
    outcome = [f"surviving workers: {_err_summary(werrs, victim)}"]
    for n in [n for n in survivors if not n.startswith("worker")]:
        seen = next((x for x in (r["survivors"][n].get("line") for r in rs) if x), None)
        outcome.append(f"{n}: " + (f"logs `{strip_log(seen)}`" if seen else "no log line naming it"))
    outcome.append(_exit_codes(rs, survivors))
    launched = _launch_text(by, row)
    if launched:
        outcome.append(launched)
    return outcome


def kill_row(by: Runs, base: str, victim: str, short: bool, repeats: int, defects: list[str]) -> dict[str, Any] | None:
    """kill_server / kill_worker / kill_scheduler (``short``: the short heartbeat)."""
    row = base + ("_short" if short else "")
    rs = [r for r in by.get(row, []) if r["ok"]]
    failed = [r for r in by.get(row, []) if not r["ok"]]
    if not rs and not failed:
        return None
    survivors = [n for n in ("scheduler", "server 0", "server 1", "worker 0", "worker 1") if n != victim]
    workers = [w for w in survivors if w.startswith("worker")]
    werrs = [r["survivors"][w].get("error") for r in rs for w in workers]
    hangs = [h for r in rs for h in r.get("hang", [])]
    lost = sum(r["survivors"][w].get("mismatches", 0) for r in rs for w in workers)
    checked = sum(r["survivors"][w].get("rounds_checked", 0) for r in rs for w in workers)
    notes = []
    if hangs:
        notes.append(f"HANG: {', '.join(hangs)} got no error within 2x timeout + 20 s")
        defects.append(f"{row}: survivors hung: {hangs}")
    if failed:
        notes.append(f"{len(failed)} run(s) failed to run: {failed[0]['failure'][:150]}")
    if any(e and not e.get("typed") for e in werrs):
        defects.append(f"{row}: an untyped error reached a worker")
    notes.append("the bench's worker script exits 1 after printing the error")
    if base == "kill_server":
        notes.append("without replacement the dead server's shard is gone with it: see the restart and "
                     "replace_server rows")
    if base == "kill_scheduler":
        notes.append("servers stop when they lose the scheduler")
    detect = stat([r.get("detect_s") for r in rs])
    return {"row": row, "fault": f"SIGKILL {victim} mid-training ({_hb_text(short)})",
            "how": "`os.kill(pid, SIGKILL)` on a hand-started job (scheduler, 2 servers, 2 workers "
                   "pushing+pulling 4 keys, 50 steps/s)",
            "outcome": "; ".join(_kill_outcome(by, row, rs, victim, survivors)), "detect": detect,
            "detect_text": fmt_stat(detect, repeats),
            "lost": lost, "lost_text": f"{lost} ({checked} rounds checked before the failure)",
            "notes": "; ".join(notes)}


def restart_row(by: Runs, repeats: int, defects: list[str]) -> dict[str, Any] | None:
    """restart: a whole-job restart from the newest checkpoint."""
    rs = [r for r in by.get("restart", []) if r["ok"]]
    ref = (by.get("restart:reference") or [{}])[0]
    if not (rs or by.get("restart")):
        return None
    reference = ref.get("finals", {}) if ref.get("ok") else {}
    equal = [bool(reference) and r.get("finals") == reference and len(reference) == 2 for r in rs]
    again = stat([r.get("running_again_s") for r in rs])
    notice = stat([r.get("root_cause_after_s") for r in rs])
    replayed = sorted({r.get("rounds_replayed") for r in rs}, key=str)
    resumed = sorted({s for r in rs for s in r.get("resumed_at", [])})
    outcome = (f"launcher: `{rs[0]['root_cause'] if rs else '?'}`, then `{_short_restart(rs)}`; "
               f"workers resumed at step {'/'.join(map(str, resumed))}, rounds replayed "
               f"{'/'.join(map(str, replayed))}; final exit {'/'.join(str(r.get('exit_code')) for r in rs)}; "
               f"final values bitwise equal to a crash-free run in {sum(equal)}/{len(rs)}")
    lost = len(rs) - sum(equal)
    if lost:
        defects.append("restart: final values differ from the crash-free run")
    return {"row": "restart", "fault": "SIGKILL server 0 under `pskv launch --checkpoint-dir D "
            "--max-restarts 1` (checkpoint every 4 steps, 16 steps)",
            "how": "`os.kill(pid, SIGKILL)` on the launcher's server 0 after worker 0's step 5",
            "outcome": outcome, "detect": again,
            "detect_text": f"running again after {fmt_stat(again, repeats)}; launcher noticed after "
                           f"{fmt_stat(notice, repeats)}",
            "lost": lost, "lost_text": f"{lost} (final values == crash-free run: {sum(equal)}/{len(rs)})",
            "notes": "a whole-job restart; the rounds after the newest checkpoint are computed again; "
                     "time includes starting 5 fresh processes"}


def _replace_outcome(rs: list[dict[str, Any]], role: str, repeats: int) -> list[str]:
    """The launcher's lines, the replacement's first line, and what the replacement did."""
    line = next((r["restart_line"] for r in rs if r.get("restart_line")), None) or "no restart line"
    line = re.sub(r"checkpoint \S*/(ckpt-\d+)", r"checkpoint .../\1", line)
    others = sorted({ln for r in rs for ln in r.get("launcher_lines", []) if "starting it again" not in ln})
    outcome = [f"launcher: `{line}`" + (f"; other launcher lines: {'; '.join(f'`{o}`' for o in others[:3])}"
                                       if others else "; no other launcher line")]
    first_line = next((r["replacement_first_line"] for r in rs if r.get("replacement_first_line")), None)
    if first_line:
        first_line = re.sub(r"from \S*/(ckpt-\d+)", r"from .../\1", strip_log(first_line.split("] ", 1)[-1]))
        outcome.append(f"the replacement's first line: `{first_line}`")
    if role == "worker":
        at = sorted({r.get("rejoined_at_step") for r in rs}, key=str)
        outcome.append(f"the replacement has `kv.is_recovery` and goes on at step {'/'.join(map(str, at))}; "
                       "worker 0 waited in round 6 meanwhile")
        return outcome
    restored = next((r.get("restored_line") for r in rs if r.get("restored_line")), None)
    restored = re.sub(r"from \S*/(ckpt-\d+)", r"from .../\1", restored) if restored else None
    replayed = sorted({tuple(sorted(r.get("pushes_replayed", []))) for r in rs})
    replay = stat([r.get("replay_s") for r in rs])
    if restored != first_line:
        outcome.append(f"replacement: `{restored}`" if restored else "replacement: no 'restored' line")
    outcome.append("pushes sent again per worker: " + " / ".join("+".join(map(str, x)) for x in replayed)
                   + f" (workers started sending them {fmt_stat(replay, repeats, 2)} after the kill)")
    return outcome


def _replace_texts(role: str) -> tuple[str, str, str]:
    """The row's fault, how and fixed note."""
    if role == "worker":
        return (f"SIGKILL worker 1 under `pskv launch --restart-workers 1 --recovery-timeout {RECOVERY_TIMEOUT}` "
                "(16 steps, SGD + momentum, no checkpoints)",
                "`os.kill(pid, SIGKILL)` on the launcher's worker 1 while it waits before pushing step "
                f"{REPLACE_WORKER_STEP} (it wrote the step to a file, which its replacement reads)",
                "killed on a step boundary the replacement reads back (as in tests/fault/test_worker_recovery.py)")
    return (f"SIGKILL server 0 under `pskv launch --restart-servers 1 --checkpoint-dir D --recovery-timeout "
            f"{RECOVERY_TIMEOUT}` (checkpoint every 4 of 16 steps, SGD + momentum)",
            f"`os.kill(pid, SIGKILL)` on the launcher's server 0 right after worker 0's step {REPLACE_SERVER_STEP}",
            "pushes since the newest checkpoint are kept by the workers and sent again; no shared memory with "
            "--restart-servers")


def replace_row(by: Runs, role: str, repeats: int, defects: list[str]) -> dict[str, Any] | None:
    """replace_worker / replace_server: one process replaced while the others keep running."""
    row = f"replace_{role}"
    rs = [r for r in by.get(row, []) if r["ok"]]
    failed = [r for r in by.get(row, []) if not r["ok"]]
    if not rs and not failed:
        return None
    ref = (by.get(f"{row}:reference") or [{}])[0]
    reference = ref.get("finals", {}) if ref.get("ok") and ref.get("exit_code") == 0 else {}
    equal = [len(reference) == 2 and len(set(reference.values())) == 1 and r.get("finals") == reference
             for r in rs]
    restart_ref = (by.get("restart:reference") or [{}])[0].get("finals")
    noticed, first, rejoined, progress = (stat([r.get(k) for r in rs]) for k in (
        "launcher_noticed_s", "replacement_first_line_s", "scheduler_rejoined_s", "progress_s"))
    outcome = _replace_outcome(rs, role, repeats)
    outcome.append(f"exit {'/'.join(str(r.get('exit_code')) for r in rs)}; final values bitwise equal to a "
                   f"crash-free run with the same options in {sum(equal)}/{len(rs)} (SHA-256 of both keys)")
    if reference and restart_ref:
        outcome.append("the crash-free run's values equal the restart row's: "
                       + ("yes" if reference == restart_ref else "NO"))
    lost = len(rs) - sum(equal)
    if lost or not reference:
        defects.append(f"{row}: final values differ from the crash-free run in {lost}/{len(rs)}"
                       + ("" if reference else " (no crash-free reference)"))
    fault, how, note = _replace_texts(role)
    notes = ["one process restarted; the others keep running", note]
    if failed:
        notes.append(f"{len(failed)} run(s) failed to run: {failed[0]['failure'][:150]}")
    return {"row": row, "fault": fault, "how": how, "outcome": "; ".join(outcome),
            "detect": {"launcher": noticed, "first_line": first, "rejoined": rejoined, "progress": progress},
            "detect_text": f"launcher started it again after {fmt_stat(noticed, repeats, 2)}; "
                           f"replacement's first line {fmt_stat(first, repeats, 2)}; scheduler logs it "
                           f"rejoined {fmt_stat(rejoined, repeats, 2)}; **first step completed after the "
                           f"kill {fmt_stat(progress, repeats, 2)}**",
            "lost": lost, "lost_text": f"{lost} (final values == crash-free run: {sum(equal)}/{len(rs)})",
            "notes": "; ".join(notes)}


def restart_exact_row(by: Runs, repeats: int, defects: list[str]) -> dict[str, Any] | None:
    """restart_exact: worker 1 SIGKILLed at random moments under --restart-workers; results vs a crash-free run."""
    runs = by.get("restart_exact", [])
    rs = [r for r in runs if r["ok"]]
    failed = [r for r in runs if not r["ok"]]
    if not runs:
        return None
    ref = (by.get("restart_exact:reference") or [{}])[0]
    reference = ref.get("finals", {}) if ref.get("ok") and ref.get("exit_code") == 0 else {}
    equal = [len(reference) == 2 and len(set(reference.values())) == 1 and r.get("finals") == reference
             and r.get("exit_code") == 0 for r in rs]
    hangs = sum(1 for r in rs if r.get("hang"))
    # where the kill fell: the replacement goes on one step after the last finished one (its next
    # push had not landed) or two (it had: killed right after a push, or in the pull after it)
    gap = [r["rejoined_at_step"] - r["last_step_before_kill"] for r in rs
           if r.get("rejoined_at_step") is not None and r.get("last_step_before_kill") is not None]
    landed, not_landed = sum(1 for g in gap if g == 2), sum(1 for g in gap if g == 1)
    late = sum(1 for r in rs if r.get("killed_after_final"))
    rejoined, done = stat([r.get("rejoined_s") for r in rs]), stat([r.get("kill_to_exit_s") for r in rs])
    lost = len(rs) - sum(equal)
    if lost or not reference or hangs:
        defects.append(f"restart_exact: final values differ from the crash-free run in {lost}/{len(rs)}, "
                       f"{hangs} hang(s)" + ("" if reference else " (no crash-free reference)"))
    notes = ["the replacement goes on from `kv.resume_step()`: the servers' count of its rank's pushes"]
    if late:
        notes.append(f"{late} kill(s) fell after worker 1's last step")
    if failed:
        notes.append(f"{len(failed)} run(s) failed to run: {failed[0]['failure'][:150]}")
    return {"row": "restart_exact",
            "fault": f"SIGKILL worker 1 at a random moment under `pskv launch --restart-workers 1 --recovery-timeout "
                     f"{RECOVERY_TIMEOUT}` (60 steps, SGD + momentum, w split over both servers)",
            "how": "`os.kill(pid, SIGKILL)` on the launcher's worker 1, uniformly within 0.8 s after its first step",
            "outcome": f"the push after worker 1's last finished step had landed in {landed} kill(s) and not in "
                       f"{not_landed}; exit {'/'.join(sorted({str(r.get('exit_code')) for r in rs}))}; {hangs} "
                       f"hang(s); final values bitwise equal to a crash-free run in {sum(equal)}/{len(rs)} "
                       "(SHA-256 of both keys, both workers)",
            "detect": {"rejoined": rejoined, "done": done},
            "detect_text": f"replacement went on {fmt_stat(rejoined, repeats, 2)} after the kill; job done "
                           f"{fmt_stat(done, repeats, 2)} after it",
            "lost": lost, "lost_text": f"{lost} (final values == crash-free run: {sum(equal)}/{len(rs)})",
            "notes": "; ".join(notes)}


def stop_row(by: Runs, short: bool, repeats: int, defects: list[str]) -> dict[str, Any] | None:
    """stop_worker: worker 1 hangs (SIGSTOP); stall report, then the heartbeat timeout."""
    row = "stop_worker" + ("_short" if short else "")
    rs = [r for r in by.get(row, []) if r["ok"]]
    if not rs and not by.get(row):
        return None
    stall = stat([r.get("stall_s") for r in rs])
    detect = stat([r.get("detect_s") for r in rs])
    werrs = [r["survivors"]["worker 0"].get("error") for r in rs]
    sl = next((r.get("stall_line") for r in rs if r.get("stall_line")), None)
    outcome = [f"server: `{strip_log(sl)}`" if sl else "server: NO stall report",
               f"worker 0: {_err_summary(werrs, 'worker 1')}"]
    conts = [r.get("after_cont") for r in rs]
    got = [c for c in conts if c]
    outcome.append("worker 1 after SIGCONT: " + (
        f"{got[0]['type']} after {got[0]['after_s']:.1f} s (`{got[0]['msg'][:90]}`)" if got
        else "no error within 2x timeout + 5 s (killed)") + (f" in {len(got)}/{len(conts)}" if got else ""))
    outcome.append(_exit_codes(rs, ["scheduler", "server 0", "server 1", "worker 0"]))
    launched = _launch_text(by, row)
    if launched:
        outcome.append(launched)
    hangs = [h for r in rs for h in r.get("hang", [])]
    lost = sum(r["survivors"]["worker 0"].get("mismatches", 0) for r in rs)
    checked = sum(r["survivors"]["worker 0"].get("rounds_checked", 0) for r in rs)
    notes = [f"PSKV_STALL_REPORT={(STOP_SHORT if short else STOP_DEFAULT)['PSKV_STALL_REPORT']} s"]
    if hangs:
        notes.append(f"HANG: {hangs}")
        defects.append(f"{row}: survivors hung: {hangs}")
    lv = by.get(row + ":launch", [])
    if lv and lv[0]["ok"] and lv[0]["root_cause"] and "worker 1" not in lv[0]["root_cause"]:
        notes.append("the launcher names a survivor as root cause: a hung process never exits, so it "
                     "cannot be the first failure it sees")
    return {"row": row, "fault": f"worker 1 hangs (SIGSTOP) mid-training ({_hb_text(short)})",
            "how": "`os.kill(pid, SIGSTOP)`; SIGCONT after the survivors' error, SIGKILL if still there",
            "outcome": "; ".join(outcome), "detect": {"stall": stall, "error": detect},
            "detect_text": f"stall report {fmt_stat(stall, repeats)}; NodeFailedError {fmt_stat(detect, repeats)}",
            "lost": lost, "lost_text": f"{lost} ({checked} rounds checked)", "notes": "; ".join(notes)}


def uneven_none_row(by: Runs, repeats: int, defects: list[str]) -> dict[str, Any] | None:
    """uneven_none: uneven data without a mechanism: a stall report, then a timeout."""
    rs = [r for r in by.get("uneven_none", []) if r["ok"]]
    if not (rs or by.get("uneven_none")):
        return None
    stall = stat([r.get("stall_s") for r in rs])
    err = stat([r.get("error_s") for r in rs])
    e1 = [r["worker 1"]["error"] for r in rs]
    sl = next((r.get("stall_line") for r in rs if r.get("stall_line")), None)
    w0 = rs[0]["worker 0"] if rs else {}
    outcome = (f"worker 1's 4th pushpull blocks; server: `{strip_log(sl)}`; worker 1: "
               f"{_err_summary(e1, 'server 0')}; worker 0 (out of data, in close()): "
               f"{_close_text(w0.get('close'))}; " + _exit_codes(rs, ["worker 0", "worker 1", "server 0", "scheduler"]))
    hangs = [h for r in rs for h in r.get("hang", [])]
    if hangs:
        defects.append(f"uneven_none: hung {hangs}")
    lost = sum(r[w].get("mismatches", 0) for r in rs for w in ("worker 0", "worker 1"))
    return {"row": "uneven_none", "fault": "uneven data, no mechanism (worker 0: 3 batches, worker 1: 5)",
            "how": "each worker pushpulls its own batches, then close(); PSKV_REQUEST_TIMEOUT=5, "
                   "PSKV_STALL_REPORT=2",
            "outcome": outcome, "detect": {"stall": stall, "error": err},
            "detect_text": f"stall report {fmt_stat(stall, repeats)}; OperationTimeoutError "
                           f"{fmt_stat(err, repeats)} after the call started",
            "lost": lost, "lost_text": f"{lost} (rounds 0-2 exact; round 3 never completes)",
            "notes": "a timeout, not a hang; without PSKV_REQUEST_TIMEOUT the wait is 300 s"}


def uneven_completes_row(by: Runs, variant: str, defects: list[str]) -> dict[str, Any] | None:
    """uneven_join / uneven_fit: uneven data with ``kv.join()`` or ``Trainer.fit(uneven=True)``."""
    row = f"uneven_{variant}"
    rs = [r for r in by.get(row, []) if r["ok"]]
    if not rs and not by.get(row):
        return None
    dones = [r[w]["done"] for r in rs for w in ("worker 0", "worker 1")]
    completed = sum(1 for d in dones if d)
    errors = [r[w]["error"] for r in rs for w in ("worker 0", "worker 1") if r[w]["error"]]
    if variant == "join":
        exact = sum(1 for d in dones if d and d.get("exact") and d.get("mismatches") == 0)
        lost = len(dones) - exact
        detail = (f"every epoch completes on both workers ({completed}/{len(dones)} workers done); every "
                  f"pushpull and the final value equal the sum of all pushes ({exact}/{len(dones)})")
        lost_text = f"{lost} (checked every round and the final value)"
    else:
        shas = [{d["sha"] for d in (r["worker 0"]["done"], r["worker 1"]["done"]) if d} for r in rs]
        same = sum(1 for s in shas if len(s) == 1)
        steps = sorted({d["steps"] for d in dones if d})
        detail = (f"3 epochs complete on both workers (steps per worker: {'/'.join(map(str, steps))}); "
                  f"parameters bitwise identical on both workers in {same}/{len(rs)}")
        lost = len(rs) - same
        lost_text = f"{lost} (identical parameters; every step applied on both)"
    if errors:
        detail += f"; errors: {errors[0]['type']}: {errors[0]['msg'][:100]}"
        defects.append(f"{row}: {errors[0]['type']}")
    return {"row": row, "fault": "uneven data with " + ("`kv.join()` after each epoch (2 epochs)"
                                                         if variant == "join" else "`Trainer.fit(uneven=True)`"),
            "how": "worker 0: 3 batches per epoch, worker 1: 5",
            "outcome": detail + "; " + _exit_codes(rs, ["worker 0", "worker 1", "server 0", "scheduler"]),
            "detect": None, "detect_text": "n/a (completes)", "lost": lost, "lost_text": lost_text,
            "notes": "" if variant == "join" else "1 run (PyTorch start-up)"}


def _handler_failures(rs: list[dict[str, Any]]) -> dict[str, int]:
    """The fuzz runs' server tracebacks by exception, numbers masked."""
    failures: dict[str, int] = {}
    for r in rs:
        for k, v in r["server_handler_failures"].items():
            exc = k.split(" failed: ", 1)[-1].split(" at ")[0].split(" while decoding")[0]
            exc = re.sub(r"-?\d+$", "N", exc).lstrip(": ")
            failures[exc] = failures.get(exc, 0) + v
    return failures


def _fuzz_outcome(rs: list[dict[str, Any]], failures: dict[str, int], werrs: list[dict[str, Any]]) -> str:
    sent = sum(r["sent"] for r in rs)
    rej = sum(r["server_rejected_logged"] for r in rs)
    err_replies = sum(r["replies"]["error"] for r in rs)
    tracebacks = sum(r["server_tracebacks"] for r in rs)
    dropped = sum(r.get("server_dropped_replies", 0) for r in rs)
    big = stat([r.get("probe_after_big_header_s") for r in rs])
    probe = stat([r.get("probe_s") for r in rs])
    outcome = (f"{sent} messages in {len(rs)} runs: {rej} rejected by the decoder and logged (no reply), "
               f"{err_replies} answered with an error reply (+{sum(r['replies']['other'] for r in rs)} plain "
               f"replies; {dropped} replies to the still-connected fuzzing socket dropped as 'reply to vanished "
               f"peer'); {tracebacks} logged with a traceback as untyped "
               "handler errors" + (" (" + "; ".join(f"{n}x {k}" for k, n in failures.items()) + ")" if failures
                                   else "")
               + "; the server kept serving: " + _exit_codes(rs, ["server 0", "scheduler", "worker 0", "worker 1"]))
    if werrs:
        outcome += f"; workers: {werrs[0]['type']}: `{werrs[0]['msg'][:140]}`"
    if big:
        outcome += (f"; one {rs[0]['big_header_mb']} MB header (2,000,000 declared arrays, under the 16 MB limit) "
                    f"held the server for {big['median']:.1f} s (probe without it: "
                    f"{probe['median'] if probe else '?'} s)")
    return outcome


def fuzz_row(by: Runs, repeats: int, defects: list[str]) -> dict[str, Any] | None:
    """fuzz: a stream of malformed messages to a live server."""
    rs = [r for r in by.get("fuzz", []) if r["ok"]]
    if not (rs or by.get("fuzz")):
        return None
    failures = _handler_failures(rs)
    mism = sum(r["mismatches"] for r in rs)
    checked = sum(r["rounds_checked"] for r in rs)
    werrs = [r[w]["error"] for r in rs for w in ("worker 0", "worker 1") if r[w]["error"]]
    backlog, big, gap_before, gap_during, send = (stat([r.get(k) for r in rs]) for k in (
        "backlog_s", "probe_after_big_header_s", "step_gap_before_s", "step_gap_during_s", "send_s"))
    if mism or werrs:
        defects.append(f"fuzz: {mism} wrong rounds, worker errors {[e['type'] for e in werrs]}")
    if sum(r["server_tracebacks"] for r in rs):
        defects.append("fuzz: untyped handler errors on hostile input: " + "; ".join(failures))
    return {"row": "fuzz", "fault": "malformed / hostile messages to a live server",
            "how": (f"{rs[0]['sent'] if rs else '?'} messages per run from a plain ZeroMQ DEALER to the server's "
                    "port while 2 workers train: " + ", ".join(rs[0]["kinds"]) if rs else ""),
            "outcome": _fuzz_outcome(rs, failures, werrs), "detect": {"backlog": backlog, "big_header": big},
            "detect_text": f"n/a (nothing fails). Stream sent in {fmt_stat(send, repeats)}; server still "
                           f"busy with it {fmt_stat(backlog, repeats)} after the last message; workers' "
                           f"longest pause meanwhile {fmt_stat(gap_during, repeats)} (before: "
                           f"{fmt_stat(gap_before, repeats)})",
            "lost": mism, "lost_text": f"{mism} ({checked} rounds checked, >= {EXTRA_STEPS} per worker after "
                                       "the last message)",
            "notes": "messages name keys the job does not use or senders that are not its workers"}


def _forged_part(variant: str, r: dict[str, Any], defects: list[str]) -> str:
    """One forged message's outcome."""
    if not r["ok"]:
        return f"{variant}: run failed ({r['failure'][:100]})"
    werrs = [r[w]["error"] for w in ("worker 0", "worker 1") if r[w]["error"]]
    reply = "error reply" if r["replies"]["error"] else ("ok reply" if r["replies"]["other"] else "no reply")
    text = f"**{variant}** ({FORGED[variant]}): server sent an {reply}; "
    if r["mismatches"] or werrs:
        text += (f"{r['mismatches']} rounds with wrong values on the workers"
                 + (f", {werrs[0]['type']} on {werrs[0].get('src')}: `{werrs[0]['msg'][:80]}`" if werrs else ""))
        defects.append(f"forged {variant}: one forged message as worker 0 -> {r['mismatches']} wrong rounds, "
                       f"worker errors {[e['type'] for e in werrs]}")
    else:
        text += "job unaffected, every round exact"
    return text


def forged_row(by: Runs, defects: list[str]) -> dict[str, Any] | None:
    """forged: one well-formed message per run claiming worker 0's id."""
    forged = {k.split("_", 1)[1]: v for k, v in by.items() if k.startswith("forged_")}
    if not forged:
        return None
    parts = [_forged_part(variant, runs[0], defects) for variant, runs in forged.items()]
    done = [runs[0] for runs in forged.values() if runs[0]["ok"]]
    lost = sum(r["mismatches"] for r in done)
    checked = sum(r["rounds_checked"] for r in done)
    return {"row": "forged", "fault": "one well-formed message claiming worker 0's id (node 9), acting on "
                                      "the job's key 100 or its rounds",
            "how": "sent mid-training from a plain ZeroMQ DEALER to the server's port; one run per message",
            "outcome": "; ".join(parts), "detect": None, "detect_text": "n/a", "lost": lost,
            "lost_text": f"{lost} wrong rounds ({checked} rounds checked)",
            "notes": "no authentication without CURVE (docs/security.md): a peer that reaches the port is "
                     "trusted; with `--secure` / `--curve-key` it cannot connect"}
