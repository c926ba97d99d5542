"""``tether show RUN_DIR``: sampled agent episodes, turn by turn, or single-turn samples, as text or HTML.

The agent loop appends one JSON line per sampled episode to ``RUN_DIR/transcripts.jsonl`` (the first
clone of up to four task groups per step): step, episode and group ids, env seed, task, outcome,
return, fault, and per turn the observation, the full response, the parsed action, its validity and
the env reward. A visual observation's images are PNG files under ``RUN_DIR/frames``, listed in the turn's
``frames``; the HTML page shows them. A single-turn run appends the first sample of up to four groups per step
to ``RUN_DIR/samples.jsonl`` instead: step, group, prompt, gold answer, completion, reward, its components, whether
it was correct and the answer extracted.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from tether.config import ConfigError, first_line_command


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of ``path`` (a torn last line, from a kill mid-write, is skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_transcripts(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "transcripts.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: transcripts are written by agent (env) runs")
    return _read_jsonl(path)


def format_sample(row: dict[str, Any]) -> str:
    """One single-turn sample: its step and group, reward (per component), prompt, completion, gold answer."""
    parts = ", ".join(f"{name} {value:g}" for name, value in (row.get("components") or {}).items())
    verdict = "correct" if row["correct"] else ("no answer" if row.get("extracted") is None else "wrong")
    # the logs keep the 0-based step the batch was sampled in (a resume truncates by it); shown as the run counts
    return "\n".join([f"step {row['step'] + 1}  group {row['group']}  reward {row['reward']:g} ({parts})  {verdict}",
                      f"  prompt: {row['prompt']}", f"  completion: {row['completion']}",
                      f"  answer: {row.get('answer')!r}  extracted: {row.get('extracted')!r}"])


def _head(ep: dict[str, Any]) -> str:
    fault = f"  FAULT {ep['fault']}" if ep.get("fault") else ""
    seed = f"  seed {ep['seed']}" if "seed" in ep else ""
    return (f"step {ep['step'] + 1}  episode {ep['episode']}  group {ep['group']}{seed}  "
            f"{'WON' if ep['won'] else 'lost'}  return {ep['return']:.2f}  turns {len(ep['turns'])}{fault}")


def format_episode(ep: dict[str, Any]) -> str:
    lines = [_head(ep), f"task: {ep['task']}"]
    if ep.get("x_skill"):
        lines.append(f"skill: {ep['x_skill']}")
    for i, t in enumerate(ep["turns"], 1):
        reward = f", reward {t['reward']:g}" if "reward" in t else ""
        lines.append(f"  [{i}] observation: {t['observation']}")
        if t.get("frames"):
            lines.append(f"      frames: {', '.join(t['frames'])}")
        lines += [f"      response: {t['response']}",
                  f"      action: {t['action']!r} ({'valid' if t['valid'] else 'INVALID'}{reward})"]
    return "\n".join(lines)


def _what_has_no_samples(run_dir: Path) -> str:
    """Why ``run_dir`` has no samples to show: an SFT run samples nothing, an RL run has not finished a step."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return "not a run directory"
    command = first_line_command(saved)
    if command in ("sft", "seed-sft"):
        return f"a tether {command} run, which samples nothing (its losses are in metrics.jsonl: tether plot)"
    return "a run before its first step"


def show_transcripts(run_dir: Path, *, html: bool = False, limit: int = 3) -> str:
    """The last ``limit`` episodes (or single-turn samples) as text; with ``html`` write them to
    RUN_DIR/transcripts.html instead.

    Raises:
        ConfigError: ``run_dir`` holds neither (not a run directory, or a run before its first step).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "transcripts.jsonl").is_file():
        samples = run_dir / "samples.jsonl"
        if not samples.is_file():
            what = _what_has_no_samples(run_dir)
            raise ConfigError(f"{run_dir} has neither transcripts.jsonl (agent runs) nor samples.jsonl (single-turn "
                              f"runs): {what}")
        rows = _read_jsonl(samples)[-limit:]
        if html:
            out = run_dir / "transcripts.html"
            out.write_text(samples_html(rows), encoding="utf-8")
            return f"wrote {out}"
        return "\n\n".join(format_sample(row) for row in rows)
    episodes = read_transcripts(run_dir)[-limit:]
    if html:
        out = Path(run_dir) / "transcripts.html"
        out.write_text(to_html(episodes), encoding="utf-8")
        return f"wrote {out}"
    return "\n\n".join(format_episode(ep) for ep in episodes)


def _images(turn: dict[str, Any]) -> str:
    return "".join(f'<img src="{html.escape(path)}" alt="frame">' for path in turn.get("frames", ()))


def to_html(episodes: list[dict[str, Any]]) -> str:
    """A standalone page: one table per episode (turn, observation, response, action, reward)."""
    blocks = []
    for ep in episodes:
        rows = "".join(
            f"<tr><td>{i}</td><td><pre>{html.escape(t['observation'])}</pre>{_images(t)}</td>"
            f"<td><pre>{html.escape(t['response'])}</pre></td>"
            f"<td class={'ok' if t['valid'] else 'bad'}>{html.escape(t['action'])}</td>"
            f"<td>{t.get('reward', '')}</td></tr>"
            for i, t in enumerate(ep["turns"], 1))
        skill = f"<p><b>skill:</b> {html.escape(ep['x_skill'])}</p>" if ep.get("x_skill") else ""
        blocks.append(f"<h3>{html.escape(_head(ep))}</h3><p>{html.escape(ep['task'])}</p>{skill}"
                      "<table><tr><th>#</th><th>observation</th><th>response</th><th>action</th><th>reward</th></tr>"
                      f"{rows}</table>")
    style = ("<style>body{font-family:sans-serif}td{vertical-align:top;border-top:1px solid #ccc}"
             ".bad{color:#b00}.ok{color:#070}pre{white-space:pre-wrap;margin:0}</style>")
    return f"<!doctype html><html><head><meta charset=utf-8>{style}</head><body>{''.join(blocks)}</body></html>"


def samples_html(rows: list[dict[str, Any]]) -> str:
    """A standalone page of single-turn samples: one block per sample."""
    blocks = "".join(f"<h3>{html.escape(format_sample(r).splitlines()[0])}</h3><p><b>prompt</b></p><pre>"
                     f"{html.escape(r['prompt'])}</pre><p><b>completion</b></p><pre>{html.escape(r['completion'])}"
                     "</pre>" for r in rows)
    return ("<!doctype html><html><head><meta charset=utf-8><style>body{font-family:sans-serif}pre{white-space:"
            f"pre-wrap}}</style></head><body>{blocks}</body></html>")
