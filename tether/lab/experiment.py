"""``tether experiment PROTOCOL.yaml``: arms x seeds as separate processes, then a report with intervals.

A protocol (docs/lab.md) names the arms (a config plus overrides each), the seeds, the primary endpoint (a
validation metric on a task split, read at the checkpoint chosen on the selection split or at the end), secondary
metrics and the comparisons. The runner

1. checks everything before any run starts (:mod:`.protocol_checks`): each arm's config validates, seeds are
   distinct, the endpoint and secondary metrics are ones validation logs, the task's splits exist and never share a
   prompt, the models and data each arm reads are here;
2. trains the calibration's runs first (``tether.lab.calibration``): if the endpoint does not move on the
   selection split by ``calibration.min_movement``, no other run starts and no endpoint is evaluated;
3. runs ``tether train`` once per (arm, seed) in its own process with one thread, as many at once as
   ``parallel`` allows (``trained.json`` marks a run trained, an interrupted one resumes from its checkpoint),
   then evaluates each run's endpoint checkpoint on the endpoint split (``tether eval ... val.split=<split>``,
   ``endpoint.json``);
4. writes ``report.md``, ``report.json``, ``per_seed.csv`` and ``curves.png`` under ``run_root`` (:mod:`.report`).

At the first run it writes ``run_root/protocol.lock.json``: hashes of the protocol, of every arm's resolved config
(with the files and checkpoint directories it names) and of the code (commit, clean tree). It refuses a tree with
uncommitted changes unless told (``allow_dirty``), and each run records in ``code.jsonl`` the commit each of its
processes imported.

:func:`pool_experiments` reports several finished protocols that differ only in their seeds (a replication
registered after the first) as one, over all their seeds.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import tether
from tether.config import Config, ConfigError, move_saved_keys
from tether.files import append_jsonl, write_text_atomic
from tether.lab.calibration import PASSED, endpoint_step, measure, trained
from tether.lab.protocol import Protocol, arm_config, load_protocol, resolved_arm_config, run_dir, run_overrides
from tether.lab.protocol_checks import check_protocol, evaluation_overrides
from tether.lab.report import unfinished, write_report
from tether.processes import starter_env
from tether.provenance import CODE_ROOT, git_state
from tether.track.progress import StepLines, status
from tether.trainer.rundir import fill_defaults, setting_defaults

# -- the code a run imports ------------------------------------------------------------------------


def code_state(root: Path = CODE_ROOT) -> dict[str, Any]:
    """The commit checked out at ``root`` and whether the tree is clean: no tracked change and no untracked file
    outside .gitignore (``changed`` lists up to ten of them). Not a git checkout: commit ``unknown``, not clean."""
    git = git_state(root)
    if git is None:
        return {"commit": "unknown", "clean": False, "changed": ["(not a git checkout)"]}
    return {"commit": git.commit, "clean": not git.changed, "changed": git.changed[:10]}


def refuse_dirty(code: dict[str, Any]) -> None:
    if not code["clean"]:
        raise ConfigError(f"the code's working tree ({CODE_ROOT}) is not clean: {', '.join(code['changed'])}; "
                          "commit the changes so the lock names the code that runs, or pass --allow-dirty (the "
                          "report then says the runs imported uncommitted code)")


def record_code(directory: Path, what: str) -> None:
    """Append the code state to ``RUN_DIR/code.jsonl`` as a process of this run starts: the commit it imports."""
    code = code_state()
    row = {"what": what, "commit": code["commit"], "clean": code["clean"],
           "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    append_jsonl(directory / "code.jsonl", [row])


def code_records(directory: Path) -> list[dict[str, Any]]:
    """The rows of ``RUN_DIR/code.jsonl``; a line torn by a kill while its process started is passed over."""
    path = directory / "code.jsonl"
    return [row for line in path.read_text().splitlines() if (row := _json_object(line)) is not None] \
        if path.is_file() else []


def _json_object(line: str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


# -- running -------------------------------------------------------------------------------------


def _tether(*args: str) -> list[str]:
    return [sys.executable, "-m", "tether.cli", *args]


def _one_thread_env() -> dict[str, str]:
    """The environment of a run's ``tether`` process: one thread, and ended (SIGTERM: it saves its step) when this
    runner ends however it ends, so a killed runner leaves no run training on (:mod:`tether.processes`)."""
    return starter_env({**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                        "TOKENIZERS_PARALLELISM": "false"})


def endpoint_checkpoint(directory: Path, at: str) -> Path:
    """``checkpoints/best``, or the step directory ``checkpoints/latest`` names."""
    root = directory / "checkpoints"
    if at == "best":
        return root / "best"
    return root / (root / "latest").read_text().strip()


def train_one(protocol: Protocol, arm: str, seed: int) -> None:
    """Train (or resume) one run; ``trained.json`` (with the endpoint step) marks it trained."""
    directory = run_dir(protocol, arm, seed)
    if trained(directory):
        return
    directory.mkdir(parents=True, exist_ok=True)
    a = protocol.arms[arm]
    log = directory / "experiment.log"
    start = time.perf_counter()
    # A run killed before its first checkpoint has nothing to resume: start it afresh over its partial files
    # (train.resume=auto would refuse to write over them, docs/reliability.md).
    fresh = [] if (directory / "checkpoints" / "latest").is_file() else ["train.resume=never", "train.overwrite=true"]
    record_code(directory, "train")
    with log.open("a") as out:
        train = subprocess.run(_tether("train", a.config, *a.overrides, *run_overrides(protocol, arm, seed), *fresh),
                               stdout=out, stderr=subprocess.STDOUT, env=_one_thread_env(), check=False)
    if train.returncode != 0:
        raise RuntimeError(f"run {arm}/seed{seed} failed (exit {train.returncode}); see {log}")
    e = protocol.endpoint
    step = endpoint_step(directory, e.at)
    if e.at == "best" and step == 0 and not e.start_selectable:
        raise RuntimeError(f"run {arm}/seed{seed}: checkpoints/best is the starting policy although "
                           "endpoint.start_selectable is false (train.best_from_step was not applied)")
    write_text_atomic(directory / "trained.json", json.dumps({"endpoint_step": step,
                                                              "train_s": round(time.perf_counter() - start, 1)}))


def evaluate_one(protocol: Protocol, arm: str, seed: int) -> dict[str, Any]:
    """Evaluate a trained run's endpoint on the endpoint split; ``endpoint.json`` marks it done."""
    directory = run_dir(protocol, arm, seed)
    done = directory / "endpoint.json"
    if done.is_file():
        return json.loads(done.read_text())
    e = protocol.endpoint
    checkpoint = endpoint_checkpoint(directory, e.at)
    record_code(directory, "eval")
    evaluation = subprocess.run(
        _tether("eval", str(checkpoint), "--config", str(directory / "config.yaml"),
                *evaluation_overrides(protocol, arm_config(protocol, arm, seed))),
        capture_output=True, text=True, env=_one_thread_env(), check=False)
    if evaluation.returncode != 0:
        raise RuntimeError(f"endpoint evaluation of {arm}/seed{seed} failed: {evaluation.stderr[-2000:]}")
    result = json.loads(evaluation.stdout[evaluation.stdout.index("{"):])
    record = {"arm": arm, "seed": seed, "checkpoint": str(checkpoint), "split": e.split,
              "step": endpoint_step(directory, e.at), "metrics": result}
    write_text_atomic(done, json.dumps(record, indent=2))
    return record


def run_one(protocol: Protocol, arm: str, seed: int) -> dict[str, Any]:
    train_one(protocol, arm, seed)
    return evaluate_one(protocol, arm, seed)


def run_all(protocol: Protocol, work: Callable[[Protocol, str, int], Any], jobs: list[tuple[str, int]]) -> list[str]:
    """``work`` on each (arm, seed), ``parallel`` at once; the failures, one line each, in the order of ``jobs``.
    Each run that ends prints one line on stderr: which, how many are done and running, and the ETA."""
    failures: dict[tuple[str, int], str] = {}
    lines = StepLines(len(jobs), label="run")
    if jobs:
        status(f"experiment {protocol.name}: {len(jobs)} runs, {protocol.parallel} at a time")
    with ThreadPoolExecutor(max_workers=protocol.parallel) as pool:
        futures = {pool.submit(work, protocol, arm, seed): (arm, seed) for arm, seed in jobs}
        for done, future in enumerate(as_completed(futures), start=1):
            arm, seed = futures[future]
            try:
                future.result()
                outcome = "done"
            except RuntimeError as err:
                failures[(arm, seed)] = f"{arm}/seed{seed}: {err}"
                outcome = "FAILED"
            running = min(protocol.parallel, len(jobs) - done)
            lines.update(done, f"{arm}/seed{seed} {outcome}, {running} running")
    return [failures[job] for job in jobs if job in failures]


def finished_records(protocol: Protocol) -> list[dict[str, Any]]:
    """Each run's ``endpoint.json`` with the code records of its processes."""
    records = []
    for arm in protocol.arms:
        for seed in protocol.arm_seeds(arm):
            directory = run_dir(protocol, arm, seed)
            if (directory / "endpoint.json").is_file():
                records.append({**json.loads((directory / "endpoint.json").read_text()),
                                "code": code_records(directory)})
    return records


# -- the lock --------------------------------------------------------------------------------------


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def protocol_committed(path: Path) -> bool:
    """True when the protocol file is tracked by git and has no uncommitted change."""
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], capture_output=True, check=False)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], capture_output=True, check=False)
    except OSError:
        return False
    return tracked.returncode == 0 and dirty.returncode == 0


def named_files(config: Any) -> dict[str, str]:
    """path -> sha256 of each file a resolved config names by a path (``imports``' .py files, a chat template,
    a task's or SFT's data): their text is not in the config, and outside the checkout no commit covers it.
    Directories are :func:`named_directories`."""
    if isinstance(config, dict):
        return {k: v for value in config.values() for k, v in named_files(value).items()}
    if isinstance(config, list):
        return {k: v for value in config for k, v in named_files(value).items()}
    if isinstance(config, str) and ("/" in config or "." in config) and Path(config).is_file():
        return {config: hashlib.sha256(Path(config).read_bytes()).hexdigest()}
    return {}


TARGET = re.compile(r"([A-Za-z_][\w.]*):[A-Za-z_][\w.]*")  # a ``module:Name`` reference (user_code.resolve_target)
# code no lock of a study needs to hash: the standard library, installed packages (their versions are the
# environment's), and tether itself (the lock's commit)
NOT_USER_CODE = tuple({Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
                      | {Path(tether.__file__).resolve().parent})


def user_code_files(config: dict[str, Any]) -> dict[str, str]:
    """path -> sha256 of each source file of user code a resolved config runs: each ``imports`` entry (a module name
    or a ``.py`` file), the module of each ``module:Name`` reference, and the user modules those import, followed
    through their ``import`` statements. A config names its modules by name, not by path, so an edit to one, or to
    a file one of them imports, ran as the registered arm without a word."""
    entries = [*(config.get("imports") or []), *(m.group(1) for m in _targets(config))]
    found: dict[Path, str] = {}
    todo = [path for entry in entries if (path := _module_file(entry, None)) is not None]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        source = path.read_bytes()
        found[path] = hashlib.sha256(source).hexdigest()
        todo += [p for name in _imported_names(source, path) if (p := _module_file(name, path)) is not None]
    named = {Path(entry).resolve() for entry in config.get("imports") or [] if entry.endswith(".py")}
    return {str(path): digest for path, digest in sorted(found.items()) if path not in named}  # named_files has them


def _targets(config: Any) -> list[re.Match[str]]:
    if isinstance(config, dict):
        return [m for value in config.values() for m in _targets(value)]
    if isinstance(config, list):
        return [m for value in config for m in _targets(value)]
    return [m] if isinstance(config, str) and (m := TARGET.fullmatch(config)) else []


def _imported_names(source: bytes, path: Path) -> list[str]:
    """The absolute module names a source file imports (``from x import y`` gives ``x`` and ``x.y``, either may be
    the module); a relative import is resolved against the file's package, a file that does not parse gives none."""
    try:
        tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError):
        return []
    package = path.parent.name if (path.parent / "__init__.py").is_file() else None
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if package is None:
                    continue
                base = ".".join(filter(None, [package, base]))
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)] if base else []
    return names


def _module_file(name: str, importer: Path | None) -> Path | None:
    """The source file of user module ``name`` (or of a ``.py`` entry), looked up as the run finds it: beside the
    importing file first (user_code puts a file's folder on ``sys.path``), then on ``sys.path``; None for code
    that is not the user's (:data:`NOT_USER_CODE`) or that is not found."""
    if name.endswith(".py"):
        path = Path(name)
    else:
        path = None
        if importer is not None:
            parts = name.split(".")
            for candidate in (importer.parent.joinpath(*parts).with_suffix(".py"),
                              importer.parent.joinpath(*parts, "__init__.py")):
                if candidate.is_file():
                    path = candidate
                    break
        if path is None:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):  # a parent that is not a package, a name that does not import
                return None
            if spec is None or not spec.origin or not spec.has_location:
                return None
            path = Path(spec.origin)
    if not path.is_file() or path.suffix != ".py":
        return None
    path = path.resolve()
    return None if any(path.is_relative_to(root) for root in NOT_USER_CODE) else path


def named_directories(config: Any, hashed: dict[str, str] | None = None) -> dict[str, str]:
    """path -> :func:`directory_sha256` of each directory a resolved config names by a path: a checkpoint as
    ``model.name``, an EAPO prior, an SFT sampler, a task's data folder. The config holds only the path, so new
    weights under the same path were another arm that the lock did not see. A directory holding the working
    directory (``.``, ``..``) is the checkout, which the commit covers. ``hashed`` keeps the hashes already read
    (arms that share a checkpoint read its bytes once)."""
    hashed = {} if hashed is None else hashed
    if isinstance(config, dict):
        return {k: v for value in config.values() for k, v in named_directories(value, hashed).items()}
    if isinstance(config, list):
        return {k: v for value in config for k, v in named_directories(value, hashed).items()}
    if isinstance(config, str) and Path(config).is_dir() and ("/" in config or _loadable(Path(config))) \
            and not Path.cwd().resolve().is_relative_to(Path(config).resolve()):
        if config not in hashed:
            hashed[config] = directory_sha256(Path(config))
        return {config: hashed[config]}
    return {}


def _loadable(directory: Path) -> bool:
    """Whether a directory named without a ``/`` (``model.name: ckpt``) is one a loader reads: a model, an adapter or
    a saved data set. Others of such names (a split called like a folder here) are words, not paths."""
    from tether.models.lora import is_adapter_dir
    from tether.tasks.dataset_task import is_saved_dataset

    return (directory / "config.json").is_file() or is_adapter_dir(directory) or is_saved_dataset(directory)


def directory_sha256(directory: Path) -> str:
    """One sha256 over every file under ``directory`` (sorted relative paths and each file's sha256), skipping
    none: which files a loader reads (weights, config, tokenizer, an adapter) depends on the loader."""
    lines = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        with path.open("rb") as f:
            lines.append(f"{path.relative_to(directory).as_posix()}\0{hashlib.file_digest(f, 'sha256').hexdigest()}\n")
    return _sha256("".join(lines))


def lock_content(protocol: Protocol, path: Path, code: dict[str, Any]) -> dict[str, Any]:
    """What the lock covers: the protocol file, every arm's resolved config (its overrides and the runner's,
    without seed and run directory) with the files and directories it names (:func:`named_files`,
    :func:`named_directories`) and the user code it runs (:func:`user_code_files`), and the code (commit, clean
    tree); ``sha256`` hashes protocol, configs and code."""
    arms = {arm: resolved_arm_config(protocol, arm) for arm in protocol.arms}
    hashed: dict[str, str] = {}  # a checkpoint directory several arms name is read once
    hashes = {arm: _sha256(json.dumps(cfg, sort_keys=True)) for arm, cfg in arms.items()}
    protocol_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    covered = {"protocol": protocol_sha, "arms": hashes, "code": {"commit": code["commit"], "clean": code["clean"]}}
    return {"sha256": _sha256(json.dumps(covered, sort_keys=True)),
            "protocol": {"path": str(path), "sha256": protocol_sha, "design_sha256": design_sha256(protocol)},
            "arms": {arm: {"sha256": hashes[arm], "config": arms[arm], "files": named_files(arms[arm]),
                           "directories": named_directories(arms[arm], hashed),
                           "modules": user_code_files(arms[arm])} for arm in arms},
            "code": covered["code"]}


def design_sha256(protocol: Protocol) -> str:
    """The protocol as parsed, less ``parallel`` (how many runs at once changes no run): what a resumed study may
    not change."""
    return _sha256(json.dumps(protocol.model_dump(mode="json", exclude={"parallel"}), sort_keys=True))


def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """``key: old -> new`` for each dotted key whose value differs between two resolved configs."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "(absent)"), new.get(key, "(absent)")
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def arm_changes(locked: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between an arm's lock entry and its entry now (:func:`lock_content`'s: its resolved config and
    the hashes of what it names): each changed key, each named file or directory and each user module whose content
    changed (a lock without ``files``, ``directories`` or ``modules`` predates those hashes: not compared). A lock
    written by an older tether is read as this one reads a config: its moved keys at their new places, a setting
    added since at its default (what the older tether ran), so an upgrade alone changes no arm."""
    if locked is None:
        return ["not in the lock"]
    config = now["config"]
    changed = [*_changed_hashes("file", locked.get("files"), now["files"]),
               *_changed_hashes("directory", locked.get("directories"), now["directories"]),
               *_changed_hashes("module", locked.get("modules"), now["modules"])]
    defaults = setting_defaults(Config, config.get("methods") or {})
    old = fill_defaults(move_saved_keys(locked["config"], "train"), defaults)
    return [*config_changes(old, fill_defaults(config, defaults)), *changed]


def _changed_hashes(kind: str, then: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """``{kind} PATH changed`` for each path whose hash differs; nothing when the lock has no such hashes."""
    if then is None:
        return []
    return [f"{kind} {name} changed" for name in sorted(set(then) | set(now)) if then.get(name) != now.get(name)]


def refuse_changed_design(reg: dict[str, Any], protocol: Protocol, path: Path) -> None:
    """Stop before any run when the protocol or an arm's resolved config differs from the lock: the runs still to
    start (a resumed study's) would be another design than the finished ones, under one report."""
    lock, changes = reg["lock"], []
    if reg["design_changed"]:
        changes.append(f"the protocol {path} changed")
    for arm, diff in reg["arm_changes"].items():
        changes.append(f"arm {arm!r}: {'; '.join(diff[:5])}" + (f" (+{len(diff) - 5} more)" if len(diff) > 5 else ""))
    if changes:
        raise ConfigError(f"{path}: the study under {protocol.run_root} was locked at its first run "
                          f"({lock.get('started', '?')}), and since then {'; '.join(changes)}. Runs started now "
                          f"would be another design than those that ran: restore it (the lock {reg['lock_path']} "
                          "holds each arm's resolved config), or register the change as a new study with another "
                          "run_root; --report-only reports the runs that exist")


def registration(protocol: Protocol, path: Path, code: dict[str, Any], allow_dirty: bool = False) -> dict[str, Any]:
    """The lock written at the first run (``run_root/protocol.lock.json``, never rewritten) and what differs now.

    A lock from an earlier lab version hashes the protocol file only (``legacy``): what it cannot cover is said.
    """
    now = lock_content(protocol, path, code)
    lock = Path(protocol.run_root) / "protocol.lock.json"
    if not lock.is_file():
        lock.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(lock, json.dumps({**now, "protocol_committed": protocol_committed(path),
                                            "allow_dirty": allow_dirty,
                                            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                                           indent=2))
    first = json.loads(lock.read_text())
    legacy = "protocol" not in first
    if legacy:
        registered_commit = first.get("commit", "unknown")
        changes: dict[str, list[str]] = {}
        protocol_changed = first["sha256"] != now["protocol"]["sha256"]
    else:
        registered_commit = first["code"]["commit"]
        changes = {arm: diff for arm, entry in now["arms"].items()
                   if (diff := arm_changes(first["arms"].get(arm), entry))}
        protocol_changed = first["protocol"]["sha256"] != now["protocol"]["sha256"]
    # a lock written before design_sha256 existed compares the file: any edit, `parallel` included, is a change
    design_changed = (first["protocol"]["design_sha256"] != now["protocol"]["design_sha256"]
                      if not legacy and "design_sha256" in first["protocol"] else protocol_changed)
    return {"lock_path": str(lock), "lock": first, "legacy": legacy, "registered_commit": registered_commit,
            "protocol_changed": protocol_changed, "design_changed": design_changed, "arms_changed": list(changes),
            "arm_changes": changes,
            "code_now": code, "allow_dirty": allow_dirty, "protocol_committed_now": protocol_committed(path)}


# -- the whole protocol ------------------------------------------------------------------------------


def check_requirements(protocol: Protocol) -> list[str]:
    """Each of ``protocol.requires`` met: the other protocol has finished, its calibration passed, and its arm's mean
    paired difference from its baseline on its primary endpoint reaches ``min_difference``. Returns one line per
    requirement, what was read.

    Raises:
        ConfigError: the first requirement not met (which protocol, what it showed, the requirement's why).
    """
    lines = []
    for r in protocol.requires:
        other = load_protocol(r.protocol)
        path = Path(other.run_root) / "report.json"
        if not path.is_file():
            raise ConfigError(f"requires {r.protocol}, which has not reported yet (no {path}): run it first")
        data = json.loads(path.read_text())
        problems = unfinished(data)
        if problems:
            raise ConfigError(f"requires {r.protocol}, which has not finished ({'; '.join(problems[:3])})")
        if data["calibration"]["status"] != PASSED:  # failed, or its spread not estimable: no comparison ran
            raise ConfigError(f"requires {r.protocol}, whose calibration did not pass "
                              f"({data['calibration']['status']}): nothing of {protocol.name!r} runs ({r.why})")
        metric = other.endpoint.metric
        c = data["summary"][metric]["versus_baseline"][r.arm]
        read = (f"{r.protocol}: {r.arm} - {other.baseline}, {metric} on split {other.endpoint.split}, "
                f"{c['mean']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]")
        if not c["mean"] >= r.min_difference:  # NaN (no paired seed) fails too
            raise ConfigError(f"requires {read}, below {r.min_difference}: nothing of {protocol.name!r} runs "
                              f"({r.why})")
        lines.append(f"{read} >= {r.min_difference}: met")
    return lines


def run_experiment(path: str | Path, *, report_only: bool = False, allow_dirty: bool = False) -> dict[str, Any]:
    """Check; run the calibration; run the comparison only if it passed; report. Returns the report's data (also
    written as ``report.json``).

    Raises:
        ConfigError: the protocol fails a check, or the code's tree is not clean and ``allow_dirty`` is false.
    """
    path = Path(path)
    protocol = load_protocol(path)
    power = check_protocol(protocol, inputs=not report_only)  # a report reads the runs, not their inputs
    code = code_state()
    if report_only and not (Path(protocol.run_root) / "protocol.lock.json").is_file():
        raise ConfigError(f"{path}: has not run (no {protocol.run_root}/protocol.lock.json), so there is nothing "
                          "to report; the lock is written by the first run")
    if not report_only and not allow_dirty:
        refuse_dirty(code)
    if not report_only:
        status(power)
        for line in check_requirements(protocol):
            status(f"requirement {line}")
    reg = registration(protocol, path, code, allow_dirty)
    failures: list[str] = []
    locate = partial(run_dir, protocol)
    if not report_only:
        refuse_changed_design(reg, protocol, path)
        if code["commit"] != reg["registered_commit"]:
            status(f"the code is at commit {code['commit'][:10]}, not the registered {reg['registered_commit'][:10]}: "
                   "runs started now are listed in the report under 'Runs not on the registered code'")
        calibration_jobs = [(arm, seed) for seed in protocol.calibration_seeds() for arm in protocol.calibration_arms()]
        failures = run_all(protocol, train_one, calibration_jobs)
    calibration = measure(protocol, locate)
    if not report_only and not failures and calibration["status"] == PASSED:
        failures = run_all(protocol, run_one, comparison_jobs(protocol))
    return write_report(protocol, finished_records(protocol), reg, failures, calibration, [reg["lock_path"]])


def comparison_jobs(protocol: Protocol) -> list[tuple[str, int]]:
    """Every (arm, seed) run of the study, seed-major so that early seeds finish first; an arm with its own
    ``seeds`` runs those only."""
    return [(arm, seed) for seed in protocol.seeds for arm in protocol.arms if seed in protocol.arm_seeds(arm)]


# -- pooling a replication ------------------------------------------------------------------------

POOLED_FIELDS = ("arms", "baseline", "endpoint", "secondary", "comparisons", "test_size", "calibration")


def pool_protocols(protocols: list[Protocol]) -> Protocol:
    """One protocol over the seeds of ``protocols``, which must agree on everything but name, seeds, run root and
    parallelism (a replication on new seeds); it keeps the first one's run root.

    Raises:
        ConfigError: a field differs (which one, between which protocols), or a seed appears in two of them.
    """
    first = protocols[0]
    limited = [arm for p in protocols for arm, a in p.arms.items() if a.seeds is not None]
    if limited:
        raise ConfigError(f"cannot pool: arm(s) {sorted(set(limited))} run only some seeds (arms.NAME.seeds), "
                          "which a pooled protocol over other seeds cannot keep")
    for other in protocols[1:]:
        for field in POOLED_FIELDS:
            if getattr(other, field) != getattr(first, field):
                raise ConfigError(f"cannot pool {other.name!r} with {first.name!r}: their {field} differ (only "
                                  "name, seeds, run_root and parallel may)")
    seeds = [s for p in protocols for s in p.seeds]
    shared = sorted({s for s in seeds if seeds.count(s) > 1})
    if shared:
        raise ConfigError(f"cannot pool: seed(s) {shared} are in more than one protocol")
    return first.model_copy(update={"name": " + ".join(p.name for p in protocols), "seeds": seeds})


def pool_experiments(paths: list[str | Path], out: str | Path) -> dict[str, Any]:
    """The report of :func:`pool_protocols` over finished runs, written under ``out``; each protocol must have
    run (its ``protocol.lock.json`` exists), and a run without ``endpoint.json`` is listed as missing. The
    calibration is measured over all the pooled seeds."""
    protocols = [load_protocol(p) for p in paths]
    pooled = pool_protocols(protocols).model_copy(update={"run_root": str(out)})
    code = code_state()
    regs, records, missing = [], [], []
    owner: dict[int, Protocol] = {}
    for protocol, path in zip(protocols, paths, strict=True):
        if not (Path(protocol.run_root) / "protocol.lock.json").is_file():
            raise ConfigError(f"{path}: has not run (no {protocol.run_root}/protocol.lock.json); run it first")
        regs.append(registration(protocol, Path(path), code))
        owner.update({seed: protocol for seed in protocol.seeds})
        records += finished_records(protocol)
        missing += [f"{arm}/seed{seed} of {protocol.name}: no endpoint.json" for arm in protocol.arms
                    for seed in protocol.seeds if not (run_dir(protocol, arm, seed) / "endpoint.json").is_file()]
    calibration = measure(pooled, lambda arm, seed: run_dir(owner.get(seed, protocols[0]), arm, seed))
    reg = {**regs[0], "protocol_changed": any(r["protocol_changed"] for r in regs),
           "arms_changed": sorted({a for r in regs for a in r["arms_changed"]}), "pooled": regs}
    return write_report(pooled, records, reg, missing, calibration, [r["lock_path"] for r in regs])
