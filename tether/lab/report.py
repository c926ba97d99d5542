"""The report of an experiment: ``report.json`` (everything), ``report.md`` (tables), ``per_seed.csv`` (one row per
run), ``curves.png`` (bands); :func:`publish_report` copies a finished study's into the repository, and
:func:`rebuild_published` rewrites a published one from its ``report.json`` alone."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

from tether.config import ConfigError
from tether.lab import stats
from tether.lab.calibration import FAILED, INCOMPLETE, PASSED, judged, selection_values
from tether.lab.protocol import Protocol, arm_config, run_dir


def endpoint_values(records: list[dict[str, Any]], metric: str) -> dict[str, dict[int, float]]:
    """arm -> seed -> the metric's endpoint value; a non-finite value is left out (the seed is then unpaired, and
    for the primary endpoint the run is failed: :func:`nonfinite_endpoints`), as one NaN would make its arm's mean,
    interval and every comparison with it NaN."""
    out: dict[str, dict[int, float]] = {}
    for r in records:
        if metric in r["metrics"] and math.isfinite(float(r["metrics"][metric])):
            out.setdefault(r["arm"], {})[r["seed"]] = float(r["metrics"][metric])
    return out


def nonfinite_endpoints(protocol: Protocol, records: list[dict[str, Any]]) -> list[str]:
    """Runs whose primary endpoint is missing or not finite: failed runs (the study is not finished)."""
    metric = protocol.endpoint.metric
    return [f"{r['arm']}/seed{r['seed']}: endpoint {metric} is {r['metrics'].get(metric, 'missing')}"
            for r in records if not math.isfinite(float(r["metrics"].get(metric, math.nan)))]


def evaluation_answers(protocol: Protocol) -> int | None:
    """Answers behind one run's endpoint value (prompts of the split x samples)."""
    from tether.config import load_config
    from tether.tasks import make_task, task_split

    cfg = arm_config(protocol, protocol.baseline, protocol.seeds[0])
    cfg = load_config(data=cfg.model_dump(mode="json"), overrides=protocol.endpoint.overrides)
    if cfg.task is None:
        return cfg.env.val_tasks * (1 if cfg.val.greedy else cfg.val.samples)
    prompts = len(task_split(make_task(cfg.task.name, **cfg.task.kwargs), protocol.endpoint.split))
    if cfg.val.max_prompts:
        prompts = min(prompts, cfg.val.max_prompts)
    return prompts * (1 if cfg.val.greedy else cfg.val.samples)


def summarise(protocol: Protocol, records: list[dict[str, Any]], calibration: dict[str, Any]) -> dict[str, Any]:
    """Per-arm intervals and paired comparisons for the endpoint and each secondary metric; the primary endpoint's
    comparisons (every one the protocol names, with data or not) get Holm-adjusted p-values and a label."""
    out: dict[str, Any] = {}
    for metric in [protocol.endpoint.metric, *protocol.secondary]:
        values = endpoint_values(records, metric)
        arms = {arm: {"per_seed": v, **_interval(stats.mean_ci(list(v.values())))} for arm, v in values.items()}
        base = values.get(protocol.baseline, {})
        comparisons = {}
        for arm in protocol.compared():
            comparisons[arm] = compare(values.get(arm, {}), base)
        if metric == protocol.endpoint.metric:
            label_family(comparisons, protocol.test_size.delta, calibration)
        else:
            comparisons = {arm: c for arm, c in comparisons.items() if c["n"]}
        out[metric] = {"arms": arms, "versus_baseline": comparisons}
    return out


def compare(arm: dict[int, float], base: dict[int, float]) -> dict[str, Any]:
    """One paired comparison: interval, MDE and raw p over the shared seeds, and the seeds left unpaired."""
    arm_only, base_only = stats.unpaired_seeds(arm, base)
    entry: dict[str, Any] = {"unpaired": {"arm_only": arm_only, "baseline_only": base_only}}
    if not set(arm) & set(base):
        return {**entry, "n": 0, "mean": math.nan, "sd": math.nan, "ci_low": math.nan, "ci_high": math.nan,
                "mde": math.nan, "p": math.nan}
    diff = stats.paired_difference(arm, base)
    return {**entry, **_interval(diff), "mde": stats.mde(diff.sd, diff.n), "p": stats.paired_p_value(diff)}


def label_family(comparisons: dict[str, dict[str, Any]], delta: float, calibration: dict[str, Any]) -> None:
    """Holm over the protocol's comparisons, then each one's label; none is labelled on its data unless the
    calibration passed: a failed one makes every comparison *not testable in this setting*, one not measured yet or
    whose spread is not estimable (it showed neither) *inconclusive*."""
    adjusted = stats.holm([c["p"] for c in comparisons.values()])
    family = len(comparisons)
    for c, p_holm in zip(comparisons.values(), adjusted, strict=True):
        c["p_holm"] = p_holm
        diff = stats.Interval(c["n"], c["mean"], c["sd"], c["ci_low"], c["ci_high"])
        c["equivalence_low"], c["equivalence_high"] = stats.equivalence_interval(diff, family)
        if calibration["status"] == FAILED:
            c["label"] = stats.NOT_TESTABLE
        elif calibration["status"] != PASSED or c["n"] == 0:
            c["label"] = stats.INCONCLUSIVE
        else:
            c["label"] = stats.label(diff, p_holm, delta, family)


def endpoint_steps(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """arm -> the endpoint step -> how many runs read their endpoint there."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        steps = out.setdefault(r["arm"], {})
        key = str(r.get("step", "unknown"))
        steps[key] = steps.get(key, 0) + 1
    return {arm: dict(sorted(s.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0)))
            for arm, s in out.items()}


def code_flags(records: list[dict[str, Any]], registered_commit: str) -> list[str]:
    """Runs whose processes imported another commit than the registered one, or an unclean tree, or that
    recorded none (run by an earlier lab version)."""
    flags = []
    for r in sorted(records, key=lambda r: (r["arm"], r["seed"])):
        run = f"{r['arm']}/seed{r['seed']}"
        code = r.get("code", [])
        if not code:
            flags.append(f"{run}: recorded no commit")
            continue
        other = sorted({c["commit"][:10] for c in code if c["commit"] != registered_commit})
        if other:
            flags.append(f"{run}: imported commit {', '.join(other)}, not the registered {registered_commit[:10]}")
        if not all(c["clean"] for c in code):
            flags.append(f"{run}: imported a tree with uncommitted changes")
    return flags


def _interval(ci: stats.Interval) -> dict[str, float]:
    return {"n": ci.n, "mean": ci.mean, "sd": ci.sd, "ci_low": ci.low, "ci_high": ci.high}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))) else f"{x:.3f}"


def _p(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.4f}"


def _limited_arms(protocol: Protocol) -> str:
    """`` (arm `x` on seeds [...] only)`` for the arms that run some seeds (``arms.NAME.seeds``), else nothing."""
    limited = [f"`{name}` on seeds {arm.seeds} only" for name, arm in protocol.arms.items() if arm.seeds is not None]
    return f" ({'; '.join(limited)})" if limited else ""


def _seeds(unpaired: dict[str, list[int]], baseline: str) -> str:
    parts = []
    if unpaired["arm_only"]:
        parts.append(f"arm only: {unpaired['arm_only']}")
    if unpaired["baseline_only"]:
        parts.append(f"{baseline} only: {unpaired['baseline_only']}")
    return "; ".join(parts) or "none"


def test_size_lines(protocol: Protocol) -> list[str]:
    t = protocol.test_size
    lines = [f"**Test size** δ = {t.delta:g} ({protocol.endpoint.metric}, absolute). Derivation: "
             f"{t.derivation.strip().rstrip('.')}."]
    if t.paper_relative_gain is not None:
        lines.append(f"The paper's relative gain {t.paper_relative_gain:g} ({t.paper_rows}) x this setting's "
                     f"baseline {t.setting_baseline:g} = {t.paper_relative_gain * t.setting_baseline:.4f}.")
    else:
        lines.append("Not derived from a relative gain of the paper applied to this setting's baseline.")
    if t.pilot_sd is not None:
        lines.append(f"At the spread measured before registration, test_size.pilot_sd = {t.pilot_sd:g} "
                     f"({t.pilot_source}), the MDE over {len(protocol.seeds)} seeds is "
                     f"{_fmt(stats.mde(t.pilot_sd, len(protocol.seeds)))}.")
    if t.underpowered:
        lines.append(f"*Registered with an MDE above δ:* {t.underpowered}")
    if t.added_after_registration:
        lines.append(f"*Written after registration:* {t.added_after_registration}")
    return [" ".join(lines), ""]


def lock_lines(reg: dict[str, Any]) -> list[str]:
    lock = reg["lock"]
    if reg["legacy"]:
        lines = [f"**Lock** (`{reg['lock_path']}`, an earlier lab version: it hashes the protocol file only, not the "
                 f"arm configs or the code): protocol sha256 `{lock['sha256'][:16]}`, first run at commit "
                 f"`{reg['registered_commit'][:10]}` ({lock.get('started', '?')}), protocol committed then: "
                 f"{lock.get('committed', '?')}."]
    else:
        code = lock["code"]
        lines = [f"**Lock** sha256 `{lock['sha256'][:16]}` (`{reg['lock_path']}`), written at the first run "
                 f"({lock['started']}): protocol `{lock['protocol']['sha256'][:16]}` (committed then: "
                 f"{lock['protocol_committed']}), {len(lock['arms'])} resolved arm configs, code at commit "
                 f"`{code['commit'][:10]}` (tree clean: {code['clean']}"
                 + ("; **registered with --allow-dirty**" if lock.get("allow_dirty") else "") + ")."]
    lines.append(f"Since then: protocol changed: **{reg['protocol_changed']}**; arm configs changed: "
                 f"**{', '.join(reg['arms_changed']) or 'none'}**; code now at `{reg['code_now']['commit'][:10]}` "
                 f"(clean: {reg['code_now']['clean']}).")
    if reg["allow_dirty"] and not reg["code_now"]["clean"]:
        lines.append("**This invocation ran with --allow-dirty on a tree with uncommitted changes.**")
    return [" ".join(lines), ""]


def rebuilt_lines(rebuilt: dict[str, Any] | None) -> list[str]:
    """What a report rebuilt from a published ``report.json`` (:func:`rebuild_published`) says of itself."""
    if rebuilt is None:
        return []
    return [f"**Rebuilt** from the published `{rebuilt['from']}` (the runs, calibration and registration recorded "
            f"there; the lock line above is as first reported) by the lab at commit `{rebuilt['commit'][:10]}` "
            f"(tree clean: {rebuilt['clean']}): the calibration's verdict, the intervals, tests and labels follow that "
            "commit's rules; the failures are as recorded.", ""]


def calibration_lines(c: dict[str, Any]) -> list[str]:
    what = {"positive_control": f"`{c['arm']}` minus the baseline at the endpoint step",
            "fall": f"`{c['arm']}`'s start (step 0) minus its endpoint step",
            "rise": f"`{c['arm']}`'s last step minus its start (step 0)"}[c["kind"]]
    lines = ["## Calibration", "", f"{c['kind']}: {what}, `{c['metric']}` on the selection split, seeds {c['seeds']}; "
             f"required: mean movement ≥ {c['min_movement']:g}, its 95% interval above 0. {c['why']}"]
    if c["added_after_registration"]:
        lines.append(f"*Written after registration:* {c['added_after_registration']}")
    lines.append("")
    if c["status"] == INCOMPLETE:
        lines.append(f"**Incomplete**: not trained yet: {', '.join(c['missing'])}.")
    else:
        per_seed = ", ".join(f"{s}: {v:+.3f}" for s, v in sorted(c["per_seed"].items()))
        lines.append(f"Measured movement {c['mean']:+.3f} [{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}] (per seed: "
                     f"{per_seed}): **{c['status']}**" + ("" if c["status"] == PASSED else
                                                         "; no comparison was run or labelled on its data."))
    return [*lines, ""]


def markdown(protocol: Protocol, data: dict[str, Any]) -> str:
    e, reg, summary = protocol.endpoint, data["registration"], data["summary"]
    answers = data["answers_per_run"]
    lines = [f"# Experiment: {protocol.name}", "", protocol.question, "",
             f"Endpoint: `{e.metric}` on split `{e.split}` at the `{e.at}` checkpoint"
             f"{' (chosen on the selection split' if e.at == 'best' else ''}"
             f"{'; step 0 allowed)' if e.at == 'best' and e.start_selectable else ''}"
             f"{'; step 0 excluded)' if e.at == 'best' and not e.start_selectable else ''}; {answers or '?'} answers "
             f"per run. Seeds: {protocol.seeds}{_limited_arms(protocol)}. Baseline: `{protocol.baseline}`.", "",
             *test_size_lines(protocol), *lock_lines(reg), *rebuilt_lines(data.get("rebuilt")),
             *calibration_lines(data["calibration"])]
    for metric, part in summary.items():
        primary = metric == e.metric
        lines += [f"## `{metric}`" + (" (primary)" if primary else ""), "",
                  "| arm | n | mean | 95% CI | per seed |", "|---|---|---|---|---|"]
        for arm, a in part["arms"].items():
            seeds = ", ".join(f"{s}: {v:.3f}" for s, v in sorted(a["per_seed"].items()))
            lines.append(f"| {arm} | {a['n']} | {_fmt(a['mean'])} | [{_fmt(a['ci_low'])}, {_fmt(a['ci_high'])}] "
                         f"| {seeds} |")
        if part["versus_baseline"]:
            level = f"{100 * (1 - stats.ALPHA / len(part['versus_baseline'])):.4g}% CI"
            head = ("| arm | n | difference | 95% CI | MDE (80% power) | p | "
                    + f"p (Holm) | label | {level} (equivalence) | " * primary)
            lines += ["", f"Paired differences against `{protocol.baseline}` (same seeds):", "",
                      head + "unpaired seeds |", "|---" * head.count("|") + "|"]
            for arm, c in part["versus_baseline"].items():
                row = (f"| {arm} | {c['n']} | {_fmt(c['mean'])} | [{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}] "
                       f"| {_fmt(c['mde'])} | {_p(c['p'])} | ")
                if primary:
                    row += (f"{_p(c['p_holm'])} | **{c['label']}** | [{_fmt(c['equivalence_low'])}, "
                            f"{_fmt(c['equivalence_high'])}] | ")
                lines.append(row + f"{_seeds(c['unpaired'], protocol.baseline)} |")
        lines.append("")
    if data["endpoint_steps"]:
        lines += ["## Endpoint steps", "", "How many runs read their endpoint at each step:", "",
                  "| arm | step: runs |", "|---|---|"]
        lines += [f"| {arm} | {', '.join(f'{s}: {n}' for s, n in steps.items())} |"
                  for arm, steps in data["endpoint_steps"].items()]
        lines.append("")
    if data["code_flags"]:
        lines += ["## Runs not on the registered code", "", *[f"- {f}" for f in data["code_flags"]], ""]
    if data["failures"]:
        lines += ["## Failed or missing runs", "", *[f"- {f}" for f in data["failures"]], ""]
    lines += [f"Labels (primary endpoint; Holm's correction over the {len(protocol.compared())} comparisons, "
              f"α = {stats.ALPHA}): *better* / *worse*: the Holm-adjusted p-value of the paired t test is below α "
              "(the sign of the difference gives which); *no effect of size delta*: the whole equivalence interval "
              f"(the 1 − α/{len(protocol.compared())} interval: Bonferroni over the comparisons) lies inside "
              f"±{protocol.test_size.delta:g}; *inconclusive*: neither (or no paired seed, or a calibration "
              "neither passed nor failed: its movements all equal, or one seed's, so its spread not estimable); "
              "*spread not estimable*: the paired differences are all equal, so no p-value or interval can be "
              "computed from them; *not testable in this setting*: the calibration failed, so nothing is labelled "
              "on its data.", ""]
    return "\n".join(lines)


def per_seed_csv(protocol: Protocol, records: list[dict[str, Any]]) -> str:
    """One row per finished run: arm, seed, endpoint step, the commits its processes imported, whether every
    one was clean, and each endpoint metric."""
    metrics = [protocol.endpoint.metric, *protocol.secondary]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["arm", "seed", "step", "commits", "clean", *metrics])
    for r in sorted(records, key=lambda r: (list(protocol.arms).index(r["arm"]), r["seed"])):
        code = r.get("code", [])
        writer.writerow([r["arm"], r["seed"], r.get("step", ""),
                         " ".join(sorted({c["commit"] for c in code})), all(c["clean"] for c in code) if code else "",
                         *[r["metrics"].get(m, "") for m in metrics]])
    return buffer.getvalue()


def training_curves(protocol: Protocol, metric: str) -> dict[str, dict[int, list[float]]]:
    """arm -> step -> the metric's values over seeds, on the selection split during training (metrics.jsonl)."""
    curves: dict[str, dict[int, list[float]]] = {}
    for arm in protocol.arms:
        for seed in protocol.arm_seeds(arm):
            for step, value in selection_values(run_dir(protocol, arm, seed), metric).items():
                curves.setdefault(arm, {}).setdefault(step, []).append(value)
    return curves


def plot_curves(protocol: Protocol, path: Path) -> Path | None:
    """Mean and 95% band over seeds of the endpoint metric on the selection split, per arm, against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = training_curves(protocol, protocol.endpoint.metric)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm, by_step in curves.items():
        steps = sorted(by_step)
        cis = [stats.mean_ci(by_step[s]) for s in steps]
        ax.plot(steps, [c.mean for c in cis], label=f"{arm} (n={max(c.n for c in cis)})")
        low = [c.low if math.isfinite(c.low) else c.mean for c in cis]
        high = [c.high if math.isfinite(c.high) else c.mean for c in cis]
        ax.fill_between(steps, low, high, alpha=0.2)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"{protocol.endpoint.metric} (selection split)")
    ax.set_title(f"{protocol.name}: mean and 95% CI over seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_data(protocol: Protocol, records: list[dict[str, Any]], reg: dict[str, Any], failures: list[str],
                calibration: dict[str, Any], lock_paths: list[str], answers: int | None) -> dict[str, Any]:
    """Everything ``report.json`` holds: the inputs as given, and what the lab derives from them (the summary, the
    endpoint steps, the code flags)."""
    return {"protocol": protocol.model_dump(), "registration": reg, "answers_per_run": answers,
            "calibration": calibration, "summary": summarise(protocol, records, calibration),
            "endpoint_steps": endpoint_steps(records), "code_flags": code_flags(records, reg["registered_commit"]),
            "failures": failures, "lock_paths": lock_paths, "runs": records}


def write_files(root: Path, protocol: Protocol, data: dict[str, Any]) -> None:
    """``report.json``, ``report.md`` and ``per_seed.csv`` of :func:`report_data`'s ``data`` under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "report.json").write_text(json.dumps(data, indent=2, default=str))
    (root / "report.md").write_text(markdown(protocol, data))
    (root / "per_seed.csv").write_text(per_seed_csv(protocol, data["runs"]))


def write_report(protocol: Protocol, records: list[dict[str, Any]], reg: dict[str, Any], failures: list[str],
                 calibration: dict[str, Any], lock_paths: list[str]) -> dict[str, Any]:
    """``report.json``, ``report.md``, ``per_seed.csv`` and ``curves.png`` under ``run_root``."""
    root = Path(protocol.run_root)
    failures = [*failures, *nonfinite_endpoints(protocol, records)]
    data = report_data(protocol, records, reg, failures, calibration, lock_paths, evaluation_answers(protocol))
    write_files(root, protocol, data)
    plot_curves(protocol, root / "curves.png")
    return data


def rebuild_published(folder: str | Path, code: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a published study's ``report.json``, ``report.md`` and ``per_seed.csv`` in ``folder`` by today's
    rules (:func:`report_data`) from what its ``report.json`` recorded: the protocol as it was registered (not the
    protocol file, which may have moved on), the runs' endpoint records, the calibration, the registration, the
    failures and the answers per run. No run directory is read (they are not committed), so there are no curves.
    ``code`` (the commit and whether its tree was clean) is recorded as ``rebuilt``, which the report states.

    Raises:
        ConfigError: ``folder`` has no ``report.json`` (a report published before the lab wrote one).
    """
    folder = Path(folder)
    path = folder / "report.json"
    if not folder.is_dir():
        from tether.files import nearest_path_guess

        guess = nearest_path_guess(str(folder))
        raise ConfigError(f"{folder}: no such folder (a published study's: docs/results/...){guess}")
    if not path.is_file():
        raise ConfigError(f"{folder}: no report.json, so nothing to rebuild the report from (a study published "
                          "before the lab wrote one keeps its report.md as written)")
    recorded = json.loads(path.read_text())
    protocol = Protocol.model_validate(recorded["protocol"])
    data = report_data(protocol, recorded["runs"], recorded["registration"], recorded["failures"],
                       recorded_calibration(recorded["calibration"]), recorded["lock_paths"],
                       recorded["answers_per_run"])
    data["rebuilt"] = {"from": str(path), "commit": code["commit"], "clean": code["clean"]}
    write_files(folder, protocol, data)
    return data


def recorded_calibration(calibration: dict[str, Any]) -> dict[str, Any]:
    """A calibration as ``report.json`` holds it, with its per-seed keys back to the seeds they were (JSON keys are
    strings, which sort seed 10 before seed 2 in the report), judged again by today's rules (:func:`judged`): the
    comparisons' labels follow its status. One still incomplete stays as recorded."""
    per_seed = {int(seed): v for seed, v in calibration["per_seed"].items()}
    if calibration["status"] == INCOMPLETE or not per_seed:
        return {**calibration, "per_seed": per_seed}
    again = judged(per_seed, dict.fromkeys(per_seed, 0.0), calibration["min_movement"])
    return {**calibration, "per_seed": per_seed, **again}


def unfinished(data: dict[str, Any]) -> list[str]:
    """What keeps a reported study from being finished (failed runs, the calibration's missing runs, or runs of
    the comparison without an endpoint); empty when finished. A calibration that did not pass finishes a study
    (failed, or its spread not estimable: its seeds would give the same movements again)."""
    protocol = Protocol.model_validate(data["protocol"])
    status = data["calibration"]["status"]
    done = {(r["arm"], r["seed"]) for r in data["runs"]}
    missing = [f"{arm}/seed{seed}" for arm in protocol.arms for seed in protocol.arm_seeds(arm)
               if (arm, seed) not in done]
    if data["failures"] or status == INCOMPLETE or (status == PASSED and missing):
        return list(data["failures"] or data["calibration"]["missing"] or missing)
    return []


def publish_report(data: dict[str, Any], dest: str | Path) -> Path:
    """Copy a finished study's report, per-seed table and lock(s) into ``dest`` (``docs/results/<study>``), to be
    committed. A study is finished when no run failed or is missing and either the calibration did not pass
    (nothing else runs) or every (arm, seed) has its endpoint.

    Raises:
        ConfigError: the study is not finished (what is missing).
    """
    protocol = Protocol.model_validate(data["protocol"])
    problems = unfinished(data)
    if problems:
        raise ConfigError(f"not publishing {protocol.name!r}: the study has not finished ({'; '.join(problems[:5])})")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(protocol.run_root)
    for name in ("report.md", "report.json", "per_seed.csv"):
        shutil.copyfile(root / name, dest / name)
    locks = [Path(p) for p in data["lock_paths"]]
    for lock in locks:
        name = "protocol.lock.json" if len(locks) == 1 else f"{lock.parent.name}.protocol.lock.json"
        shutil.copyfile(lock, dest / name)
    return dest
